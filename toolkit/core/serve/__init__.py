"""``toolkit serve``: an OpenAI-compatible HTTP server over the batching engine.

One file per role: ``commands`` (the CLI command; imports nothing optional), ``app`` (FastAPI
routes, API key, error handlers), ``protocol`` (request bodies), ``completions`` and ``chat``
(the two generation routes), ``sampling`` (request fields -> SamplingParams), ``streaming``
(server-sent events, client disconnects), ``engine_loop`` (the thread that owns the engine),
``metrics`` (Prometheus), ``state`` (what routes share), ``errors`` (OpenAI's error JSON).

FastAPI, uvicorn and prometheus-client come with the ``serve`` extra; nothing imports this
package's modules but ``commands`` unless a server is started, so ``import toolkit`` never needs them.
"""
