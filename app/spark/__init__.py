"""``spo spark-extract``: the batch pipeline's stages run as a Spark job (``job``) and its command
(``command``); PySpark is an optional extra, imported only when a job runs.

It may import ``app.batch``, ``app.core`` and ``nlp``.
"""
