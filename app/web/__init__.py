"""The Flask web layer: the routes (``api``, ``pages``), bearer tokens (``auth``), the one translator of
errors to problem+json (``errors``), the OpenAPI document (``openapi``), Prometheus metrics
(``metrics``), the served models (``registry``, ``model_slot``) and micro-batching (``microbatch``).

It may import ``app.core`` and ``nlp``; the factory (``app.create_app``) assembles it.
"""
