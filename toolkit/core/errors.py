"""Typed errors. Each names what was wrong and where (file, tensor, expected vs found)."""
from __future__ import annotations


class ToolkitError(Exception):
    """Base of every error toolkit raises on purpose."""


class PluginError(ToolkitError):
    """A plugin failed to import or broke the contract."""


class PluginConflictError(PluginError):
    """Two plugins registered the same name."""

    def __init__(self, kind: str, name: str, first: str, second: str):
        super().__init__(f"{kind} {name!r} is registered by both plugin {first!r} and plugin {second!r}")
        self.kind, self.name, self.first, self.second = kind, name, first, second


class UnknownNameError(ToolkitError, KeyError):
    """A loader, quant scheme, architecture or op nobody registered; lists the known ones."""

    def __init__(self, kind: str, name: str, known: list[str]):
        self.kind, self.name, self.known = kind, name, sorted(known)
        super().__init__(f"no plugin provides {kind} {name!r}; known {kind}s: {', '.join(self.known) or '(none)'}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class UnknownArchitectureError(UnknownNameError):
    def __init__(self, name: str, known: list[str]):
        super().__init__("architecture", name, known)


class OptionError(ToolkitError, ValueError):
    """A caller's option that cannot work here (unknown dtype or device, a device this torch lacks)."""


class SourceError(ToolkitError):
    """A model reference that does not resolve to readable files."""


class CheckpointError(ToolkitError):
    """Bad checkpoint content; carries the file and, where known, the tensor."""

    def __init__(self, message: str, *, file: str | None = None, tensor: str | None = None):
        where = ", ".join(p for p in (f"file {file}" if file else "", f"tensor {tensor!r}" if tensor else "") if p)
        super().__init__(f"{message} ({where})" if where else message)
        self.file, self.tensor = file, tensor


class CorruptFileError(CheckpointError):
    """The file's bytes do not parse as its format (bad magic, truncated header, data past the end)."""


class UnsafeCheckpointError(CheckpointError):
    """A pickle holding something other than plain tensors; refused, never executed."""


class MissingMetadataError(CheckpointError):
    """A config or metadata key the architecture needs is absent."""


class MissingTensorError(CheckpointError):
    """The model has a parameter the checkpoint never provided."""


class UnexpectedTensorError(CheckpointError):
    """The checkpoint has a tensor no parameter of the model takes."""


class ShapeMismatchError(CheckpointError):
    """A tensor's shape differs from what its parameter expects."""


class UnsupportedQuantTypeError(CheckpointError):
    """A quantization type the scheme cannot run."""


class ShardingError(CheckpointError):
    """A tensor-parallel split that the parameter's storage cannot express (cuts a quant block)."""


class ConversionError(ToolkitError):
    """A conversion that could not complete; no output is left behind."""
