"""The tokenizer a GGUF load hands out: ``tokenizers`` underneath, transformers only when asked for.

``import transformers`` costs about a second (1.2-1.5 s on the shared 2-core box), ten times what
building a 32k-token vocabulary does, and a GGUF load needs nothing else from transformers. So
``GGUFTokenizer`` answers what the engine and most callers use (``encode`` of a string,
``decode`` of a list of ids, the special tokens and their ids, the chat template, ``len``) from
the ``tokenizers.Tokenizer`` directly, and builds the ``transformers.PreTrainedTokenizerFast``
(``.hf``) the first time anything else is asked for (``apply_chat_template``, a batch call,
``save_pretrained``, ...). From then on every call and attribute goes to that wrapper, so a
change made through it (a new pad token, say) is seen everywhere.

The backend is a ``tokenizers.Tokenizer``, or, for SentencePiece vocabularies, an ``SpmBackend``
(``spm_tokenizer.py``: ``sentencepiece`` underneath, same ids, far faster to load). transformers'
wrapper needs a ``tokenizers.Tokenizer``: with an ``SpmBackend`` it is built (from the tokenizer
cache) only when ``.hf`` or ``backend_tokenizer`` is first asked for.

Both answer the same: the constructor makes the same changes to the backend that
``PreTrainedTokenizerFast.__init__`` makes (named special tokens missing from the added
vocabulary are added as special tokens; the BOS/EOS template post-processor), and the wrapper
later adopts that backend as it is (tests/test_gguf_tokenizer_wrapper.py compares the two).
"""
from __future__ import annotations

from typing import Any, Callable

from tokenizers import AddedToken, Tokenizer, processors

SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


class GGUFTokenizer:
    """A ``PreTrainedTokenizerFast`` look-alike whose transformers half is built on first need."""

    def __init__(self, backend, *, specials: dict[str, str | None], add_bos_token: bool,
                 add_eos_token: bool, chat_template: str | None, gguf_pre: str | None,
                 tokenizers_backend: Callable[[], Tokenizer] | None = None):
        set_ = object.__setattr__
        set_(self, "_backend", backend)
        # the ``tokenizers.Tokenizer`` transformers' wrapper needs: the backend itself, or built on first need
        set_(self, "_tokenizers", backend if isinstance(backend, Tokenizer) else None)
        set_(self, "_make_tokenizers", tokenizers_backend)
        set_(self, "_specials", dict(specials))
        # transformers drops a flag whose token is missing (update_post_processor)
        set_(self, "_add_bos", bool(add_bos_token) and specials.get("bos_token") is not None)
        set_(self, "_add_eos", bool(add_eos_token) and specials.get("eos_token") is not None)
        set_(self, "_flags", (bool(add_bos_token), bool(add_eos_token)))
        set_(self, "_chat_template", chat_template)
        # the file's own pre-tokenizer label, for a GGUF writer to keep
        set_(self, "_gguf_pre", gguf_pre)
        set_(self, "_hf", None)
        if self._tokenizers is not None:
            _prepare(backend, self._specials, self._add_bos, self._add_eos)
        else:
            backend.set_specials([t for name in SPECIAL_NAMES if (t := specials.get(name)) is not None],
                                 specials.get("bos_token") if self._add_bos else None,
                                 specials.get("eos_token") if self._add_eos else None)

    # ---- the transformers wrapper, built once -----------------------------------------------
    @property
    def hf(self):
        """The ``transformers.PreTrainedTokenizerFast`` over the same backend (imports transformers)."""
        if self._hf is None:
            object.__setattr__(self, "_hf", _adopt(self._tokenizers_backend(), self._specials, *self._flags,
                                                   self._chat_template))
            self._hf.gguf_pre = self._gguf_pre
        return self._hf

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # never build transformers for pickle/copy probes
            raise AttributeError(name)
        return getattr(self.hf, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.hf, name, value)

    def __call__(self, *args, **kwargs):
        return self.hf(*args, **kwargs)

    def __repr__(self) -> str:
        if self._hf is not None:
            return repr(self._hf)
        return (f"GGUFTokenizer(vocab_size={len(self)}, bos_token={self.bos_token!r}, "
                f"eos_token={self.eos_token!r}; transformers wrapper not built yet)")

    # ---- what is answered without transformers ----------------------------------------------
    def encode(self, text, text_pair=None, add_special_tokens: bool = True, **kwargs) -> list[int]:
        if self._hf is not None or kwargs or text_pair is not None or not isinstance(text, str):
            return self.hf.encode(text, text_pair, add_special_tokens=add_special_tokens, **kwargs)
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids, skip_special_tokens: bool = False, **kwargs) -> str:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        if self._hf is not None or kwargs or not isinstance(token_ids, (list, tuple)) \
                or not all(type(i) is int for i in token_ids):
            return self.hf.decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)
        return self._backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def backend_tokenizer(self) -> Tokenizer:
        return self._tokenizers_backend() if self._hf is None else self._hf.backend_tokenizer

    def __getstate__(self) -> dict:
        """Pickled (or deep-copied) with its ``tokenizers`` backend built: the function that would
        build it later holds the file's metadata, which does not pickle."""
        state = dict(vars(self))
        state["_tokenizers"], state["_make_tokenizers"] = self._tokenizers_backend(), None
        return state

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)

    def _tokenizers_backend(self) -> Tokenizer:
        """The ``tokenizers.Tokenizer`` (built now if the backend is an ``SpmBackend``), prepared as
        ``PreTrainedTokenizerFast.__init__`` would."""
        if self._tokenizers is None:
            backend = self._make_tokenizers()
            _prepare(backend, self._specials, self._add_bos, self._add_eos)
            object.__setattr__(self, "_tokenizers", backend)
        return self._tokenizers

    @property
    def gguf_pre(self) -> str | None:
        return self._gguf_pre if self._hf is None else getattr(self._hf, "gguf_pre", None)

    @property
    def chat_template(self):
        return self._chat_template if self._hf is None else self._hf.chat_template

    @property
    def add_bos_token(self) -> bool:
        return self._add_bos if self._hf is None else self._hf.add_bos_token

    @property
    def add_eos_token(self) -> bool:
        return self._add_eos if self._hf is None else self._hf.add_eos_token

    def _special(self, name: str):
        return self._specials.get(name) if self._hf is None else getattr(self._hf, name)

    def _special_id(self, name: str):
        if self._hf is not None:
            return getattr(self._hf, f"{name}_id")
        token = self._specials.get(name)
        return None if token is None else self._backend.token_to_id(token)

    bos_token = property(lambda self: self._special("bos_token"))
    eos_token = property(lambda self: self._special("eos_token"))
    unk_token = property(lambda self: self._special("unk_token"))
    pad_token = property(lambda self: self._special("pad_token"))
    bos_token_id = property(lambda self: self._special_id("bos_token"))
    eos_token_id = property(lambda self: self._special_id("eos_token"))
    unk_token_id = property(lambda self: self._special_id("unk_token"))
    pad_token_id = property(lambda self: self._special_id("pad_token"))


def _prepare(backend: Tokenizer, specials: dict[str, str | None], add_bos: bool, add_eos: bool) -> None:
    """What ``PreTrainedTokenizerFast.__init__`` does to an adopted backend, done without transformers:
    named special tokens not yet in the added vocabulary become special added tokens (one
    ``add_tokens`` call, as there), and the post-processor adds BOS/EOS as ``update_post_processor``
    writes it."""
    added = {token.content for token in backend.get_added_tokens_decoder().values()}
    missing = [AddedToken(t, special=True) for name in SPECIAL_NAMES if (t := specials.get(name)) is not None
               and t not in added]
    missing = list({token.content: token for token in missing}.values())  # a token named twice is added once
    if missing:
        backend.add_tokens(missing)
    bos, eos = specials.get("bos_token"), specials.get("eos_token")
    single = f"{(bos + ':0 ') if add_bos else ''}$A:0{(' ' + eos + ':0') if add_eos else ''}"
    pair = f"{single}{(' ' + bos + ':1') if add_bos else ''} $B:1{(' ' + eos + ':1') if add_eos else ''}"
    ids = ([(bos, backend.token_to_id(bos))] if add_bos else []) + ([(eos, backend.token_to_id(eos))] if add_eos else [])
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=ids)


def _adopt(backend: Tokenizer, specials: dict[str, str | None], add_bos: bool, add_eos: bool,
           chat_template: str | None):
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 - the costly import, only when needed

    options = dict(**specials, add_bos_token=add_bos, add_eos_token=add_eos, chat_template=chat_template,
                   clean_up_tokenization_spaces=False)
    # ``tokenizer_object=`` deep-copies the backend (a JSON round trip: ~5 s for 262k tokens). A
    # wrapper whose backend is already set adopts it as is; older transformers refuse that, so fall back.
    wrapper = PreTrainedTokenizerFast.__new__(PreTrainedTokenizerFast)
    wrapper._tokenizer = backend
    try:
        PreTrainedTokenizerFast.__init__(wrapper, **options)
    except ValueError:
        return PreTrainedTokenizerFast(tokenizer_object=backend, **options)
    return wrapper
