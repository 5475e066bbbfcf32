"""What every part of ``app`` shares: the settings and the one table of options they come from
(``options``, ``settings``), sizing workers and threads to the machine (``sizing``), logging (``logs``)
and the catalogue of problems with their stable codes (``problems``).

It may import ``nlp`` only: no Flask, no gunicorn, nothing else of ``app``.
"""
