"""`mt serve`: the HTTP server (LibreTranslate's API and ours) over one engine.

From the top: ``launch`` (bind the port, run one process or supervise ``--workers N``),
``workers`` (the worker processes), ``app`` (the FastAPI application's assembly), the routes
(``routes_libre``, ``routes_files``, ``routes_v1``), what routes share (``state``), request bodies
(``forms``), API keys and limits (``access``), translated files (``file_store``), Prometheus
counters (``metrics``), the decode worker (``batcher``) and the settings objects (``settings``,
torch-free: the command line reads them).

Never imports :mod:`transformer_mt.training` or :mod:`transformer_mt.convert`.
"""
