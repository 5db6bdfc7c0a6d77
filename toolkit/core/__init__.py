"""toolkit.core: the format-agnostic heart. It never names a file format or quant scheme."""
