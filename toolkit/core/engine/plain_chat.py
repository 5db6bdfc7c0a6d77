"""The plain conversation format ``toolkit chat`` uses for models that ship no chat template.

Base models (the demo Gemma 3 270M among them) and files converted without a template
have no ``chat_template``. Rather than refuse, ``toolkit chat`` renders the conversation as
plain text that any language model can continue::

    <system message>

    User: <message>
    Assistant: <reply>
    User: <message>
    Assistant:

and stops a reply where the model starts the next ``User:`` turn. This is a documented
fallback, not the model's own format: an instruction-tuned model answers better with its
template (pass a model that has one, or add ``chat_template`` to its tokenizer).
"""
from __future__ import annotations

USER, ASSISTANT = "User:", "Assistant:"
STOP_STRINGS = ("\nUser:",)


def render(messages: list[dict]) -> str:
    """The conversation in the plain format, ending with ``Assistant:`` ready for the reply."""
    parts = []
    for message in messages:
        role, content = message["role"], message["content"].strip()
        if role == "system":
            parts.append(f"{content}\n\n")
        else:
            parts.append(f"{USER if role == 'user' else ASSISTANT} {content}\n")
    return "".join(parts) + ASSISTANT
