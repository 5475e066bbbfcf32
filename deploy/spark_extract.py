"""``spark-submit``'s entry point for ``spo spark-extract``: the same arguments and options.

    spark-submit [SPARK OPTIONS] deploy/spark_extract.py INPUTS... OUTPUT [spo spark-extract OPTIONS]

spark-submit runs a Python application from a file and puts that file's folder first on ``sys.path``;
this launcher lives outside the ``app`` package so that nothing of the package's can hide a module of
the standard library or of a dependency. The wheel installs it as ``spo_deploy/spark_extract.py``.
docs/spark.md has the recipes.
"""

from app.spark.command import spark_extract

if __name__ == "__main__":
    spark_extract(prog_name="spo spark-extract")
