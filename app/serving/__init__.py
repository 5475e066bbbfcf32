"""The serving processes: ``spo serve`` and ``spo reload`` (``server``), gunicorn's model-aware master
(``master``), nginx in front of it (``supervisor``, ``nginx``) and the worker class
(``gunicorn_worker``).

It may import ``app.core`` and ``nlp``, and the factory ``app.create_app`` (in a worker, after the
fork); never the web layer's modules directly.
"""
