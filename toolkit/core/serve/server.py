"""Run the app under uvicorn (what ``toolkit serve`` calls once the engine is loaded)."""
from __future__ import annotations

import sys

import uvicorn

from .app import create_app
from .state import ServerSettings, ServerState

# The engine thread and the event loop share the GIL. With Python's default 5 ms switch
# interval the engine thread, back from a GPU step, could wait up to 5 ms for the event loop
# to finish writing a batch of stream chunks, longer than a decode step itself; 0.5 ms bounds it.
GIL_SWITCH_INTERVAL_S = 0.0005


def run(llm, *, model_names: list[str], api_key: str | None, max_waiting: int, chat_template: str | None,
        host: str, port: int, log_level: str = "info") -> None:
    """Serve ``llm`` until interrupted (Ctrl-C / SIGTERM stop the engine loop and return)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    settings = ServerSettings(model_names=model_names, api_key=api_key, max_waiting=max_waiting,
                              chat_template=chat_template)
    app = create_app(ServerState(llm, settings))
    print(f"toolkit serve: model {model_names[0]!r} on http://{host}:{port}/v1 "
          f"(max model length {llm.max_model_len}, {llm.block_manager.num_blocks} KV blocks)",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
