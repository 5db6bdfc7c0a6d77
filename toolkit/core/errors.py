"""Typed errors. Each names what was wrong and where (file, tensor, expected vs found)."""
from __future__ import annotations

import copy


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
    """A loader, quant scheme, architecture or op nobody registered; lists the known ones.

    :param file: the checkpoint file that asked for it, when a file did
    """

    def __init__(self, kind: str, name: str, known: list[str], *, file: str | None = None):
        self.kind, self.name, self.known, self.file = kind, name, sorted(known), file
        where = f" (file {file})" if file else ""
        super().__init__(f"no plugin provides {kind} {name!r}{where}; known {kind}s: "
                         f"{', '.join(self.known) or '(none)'}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]

    def at_file(self, file: str) -> "UnknownNameError":
        """The same error naming ``file`` (the checkpoint whose config or metadata asked for the name)."""
        return UnknownNameError(self.kind, self.name, self.known, file=file)


class UnknownArchitectureError(UnknownNameError):
    def __init__(self, name: str, known: list[str], *, file: str | None = None):
        super().__init__("architecture", name, known, file=file)

    def at_file(self, file: str) -> "UnknownArchitectureError":
        return UnknownArchitectureError(self.name, self.known, file=file)


class OptionError(ToolkitError, ValueError):
    """A caller's option that cannot work here (unknown dtype or device, a device this torch lacks)."""


class SourceError(ToolkitError):
    """A model reference that does not resolve to readable files."""


class CheckpointError(ToolkitError):
    """Bad checkpoint content; carries the file and, where known, the key (config or metadata
    entry) or tensor. ``detail`` is the message without the location."""

    def __init__(self, message: str, *, file: str | None = None, tensor: str | None = None,
                 key: str | None = None):
        parts = (f"file {file}" if file else "", f"key {key!r}" if key else "", f"tensor {tensor!r}" if tensor else "")
        where = ", ".join(p for p in parts if p)
        super().__init__(f"{message} ({where})" if where else message)
        self.detail, self.file, self.tensor, self.key = message, file, tensor, key

    def located(self, *, file: str | None = None, tensor: str | None = None) -> "CheckpointError":
        """The same error (same class) with ``file``/``tensor`` filled in where this one has none.

        Code that reads a config dict or places one tensor does not know the file; the pipeline
        that called it does, and relocates the error there.
        """
        new = copy.copy(self)
        CheckpointError.__init__(new, self.detail, file=self.file if _real_file(self.file) else file,
                                 tensor=self.tensor or tensor, key=self.key)
        return new


class CorruptFileError(CheckpointError):
    """The file's bytes do not parse as its format (bad magic, truncated header, data past the end)."""


class UnsafeCheckpointError(CheckpointError):
    """A pickle holding something other than plain tensors; refused, never executed."""


def _real_file(file: str | None) -> bool:
    # code that reads a config dict names no path ("config", "config.json"); the pipeline knows it
    return bool(file) and ("/" in file or "\\" in file)


class InvalidConfigError(CheckpointError):
    """A config or metadata value of the wrong type, out of range, or contradicting the tensors."""


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
