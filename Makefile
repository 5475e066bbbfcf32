# spo-service developer commands. `make help` lists them.
# Python 3.11, 3.12 and 3.13 are supported: `make venv` takes the newest `python3.X` that runs here
# (pyenv shims exist for versions that are not selected, so each is tried, not just looked up),
# unless PYTHON is set: `make venv PYTHON=python3.12` (another VENV keeps both: VENV=.venv-3.12).
SUPPORTED_PYTHONS := python3.13 python3.12 python3.11
# Looked up once, and only when a recipe needs it (`make help` stays instant).
PYTHON ?= $(eval PYTHON := $(or $(shell for p in $(SUPPORTED_PYTHONS); do \
	$$p -c '' >/dev/null 2>&1 && { echo $$p; break; }; done),python3))$(PYTHON)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
TRAINING_STAMP := $(VENV)/.installed-training
ONNX_STAMP := $(VENV)/.installed-onnx
OPENVINO_STAMP := $(VENV)/.installed-openvino
SPARK_STAMP := $(VENV)/.installed-spark
QUANTIZE_STAMP := $(VENV)/.installed-quantize

.DEFAULT_GOAL := help
, := ,
.PHONY: help venv dev extra-training extra-onnx extra-openvino extra-spark extra-quantize lock check format test test-deploy test-fast serve bench demo-model ner-model image clean

help:  ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

venv: $(STAMP)  ## create .venv with what serving needs (requirements.lock; newest of Python 3.13/3.12/3.11, or PYTHON=)

$(STAMP): requirements.lock pyproject.toml
	@# An existing venv keeps its Python (remove it to change); a new one gets $(PYTHON), checked.
	@if [ -x $(BIN)/python ]; then \
		echo "updating $(VENV) (Python $$($(BIN)/python -c 'import sys; print(sys.version.split()[0])'))"; \
	else \
		$(PYTHON) -c 'import sys; sys.exit(None if (3, 11) <= sys.version_info[:2] <= (3, 13) else "$(PYTHON) is Python " + sys.version.split()[0])' \
			|| { echo "spo-service needs Python 3.11, 3.12 or 3.13: install one, or set PYTHON=python3.X" >&2; exit 1; }; \
		echo "creating $(VENV) with $(PYTHON) ($$($(PYTHON) -c 'import sys; print(sys.executable, sys.version.split()[0])'))"; \
		$(PYTHON) -m venv $(VENV); \
	fi
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.lock
	# bert4keras declares keras<=2.3.1 (unsatisfiable with any TF 2.12+); it has no other dependencies.
	$(BIN)/pip install -q --no-deps bert4keras==0.11.5
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	@touch $@

dev: $(DEV_STAMP)  ## add the test, lint and lock tools and the training extra to .venv (requirements-dev.lock)

$(DEV_STAMP): $(STAMP) requirements-dev.lock
	$(BIN)/pip install -q -r requirements-dev.lock
	@touch $@

extra-training: $(TRAINING_STAMP)  ## install the optional training extra (spo make-corpus: faker)

$(TRAINING_STAMP): $(STAMP) requirements-training.lock
	$(BIN)/pip install -q -r requirements-training.lock
	@touch $@

extra-onnx: $(ONNX_STAMP)  ## install the optional onnx extra (onnx engine, spo export-onnx)

$(ONNX_STAMP): $(STAMP) requirements-onnx.lock
	$(BIN)/pip install -q -r requirements-onnx.lock
	@touch $@

extra-openvino: $(OPENVINO_STAMP)  ## install the optional openvino extra (openvino engine, spo export-openvino)

$(OPENVINO_STAMP): $(STAMP) requirements-openvino.lock
	$(BIN)/pip install -q -r requirements-openvino.lock
	@touch $@

extra-spark: $(SPARK_STAMP)  ## install the optional spark extra (spo spark-extract)

$(SPARK_STAMP): $(STAMP) requirements-spark.lock
	$(BIN)/pip install -q -r requirements-spark.lock
	@touch $@

extra-quantize: $(QUANTIZE_STAMP)  ## install the optional quantize extra (spo quantize)

$(QUANTIZE_STAMP): $(STAMP) requirements-quantize.lock
	$(BIN)/pip install -q -r requirements-quantize.lock
	@touch $@

# Every lock is compiled by uv from pyproject.toml for Python 3.11 to 3.13 at once (--universal); the
# pins already in a lock are kept unless LOCK_ARGS=--upgrade (or --upgrade-package NAME) says otherwise.
# requirements.lock is serving only; requirements-dev.lock adds the dev and training extras; every other
# lock is complete (serving + its extra) and takes the versions of requirements-dev.lock, so any of them
# installs on top of any other.
UV_COMPILE = $(BIN)/uv pip compile pyproject.toml --universal --python-version 3.11 --quiet \
	--custom-compile-command 'make lock' $(LOCK_ARGS)

lock: $(DEV_STAMP)  ## regenerate every requirements*.lock from pyproject.toml with uv (LOCK_ARGS=--upgrade moves pins)
	$(UV_COMPILE) -o requirements.lock
	$(UV_COMPILE) --extra dev --extra training -c requirements.lock -o requirements-dev.lock
	for extra in training onnx openvino spark quantize; do \
		$(UV_COMPILE) --extra $$extra -c requirements-dev.lock -o requirements-$$extra.lock || exit 1; \
	done

check: $(DEV_STAMP)  ## lint, format check and type check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(DEV_STAMP)  ## apply ruff formatting and safe fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: $(DEV_STAMP) $(ONNX_STAMP) $(OPENVINO_STAMP) $(SPARK_STAMP) $(QUANTIZE_STAMP)  ## the whole test suite, slow and live tests included (not test-deploy's)
	$(BIN)/pytest -m "not deploy"

test-deploy: $(DEV_STAMP) $(SPARK_STAMP)  ## the container image (needs Docker) and the Spark standalone cluster tests
	$(BIN)/pytest -m deploy

test-fast: $(DEV_STAMP)  ## the suite without slow and live tests
	$(BIN)/pytest -m "not slow and not live"

serve: venv  ## serve models/demo (triples, the default) and models/ner (entities); SPO_* variables configure it
	@if [ -z "$$SPO_MODELS$$SPO_MODEL_DIR" ]; then export SPO_MODELS=demo=models/demo,ner=models/ner; fi; \
	$(BIN)/spo serve

bench: $(DEV_STAMP) $(ONNX_STAMP) $(OPENVINO_STAMP)  ## run the benchmarks (hours at full counts; BENCH_ARGS="--requests 2000" to reduce; writes bench/results/)
	bash bench/setup.sh
	$(BIN)/python -m bench $(BENCH_ARGS)

demo-model: $(TRAINING_STAMP)  ## rebuild models/demo as committed (training 51 min on 2 idle Intel Xeon cores, with XLA; the whole target about 55: models/demo/README.md)
	$(BIN)/spo make-corpus data/train.jsonl --n 110000 --seed 1 --hand-written 2 --force
	$(BIN)/spo train data/train.jsonl --out models/demo --max-steps 8800 --lr 1e-3 --warmup 300 --dropout 0.1 --hidden-size 160 --serve-length 96 --link-rule mean --threshold 0 --xla --max-minutes 58 --seed 1
	$(BIN)/spo make-corpus data/heldout.jsonl --n 1000 --seed 2 --split heldout --force
	$(BIN)/spo evaluate data/heldout.jsonl --model models/demo
	$(BIN)/spo evaluate tests/training/data/everyday.jsonl --model models/demo
	$(BIN)/spo evaluate tests/training/data/everyday_dev.jsonl --model models/demo --format text
	$(BIN)/spo evaluate tests/training/data/everyday_dev2.jsonl --model models/demo --format text
	$(BIN)/spo evaluate tests/training/data/everyday_unseen.jsonl --model models/demo --format text

ner-model: $(TRAINING_STAMP)  ## rebuild models/ner (entities) exactly as committed (training 10 min on 2 idle AMD EPYC cores, 15 on an Intel Xeon; with the corpus and evaluations a few more)
	$(BIN)/spo make-corpus data/train.jsonl --n 96000 --seed 1 --force
	$(BIN)/spo train data/train.jsonl --task entities --out models/ner --max-steps 4000 --lr 1e-3 --warmup 300 --dropout 0 --serve-length 96 --max-minutes 58 --seed 1
	$(BIN)/spo make-corpus data/heldout.jsonl --n 1000 --seed 2 --split heldout --force
	$(BIN)/spo evaluate data/heldout.jsonl --model models/ner
	$(BIN)/spo evaluate tests/training/data/everyday.jsonl --model models/ner
	$(BIN)/spo evaluate tests/training/data/everyday_dev.jsonl --model models/ner
	$(BIN)/spo evaluate tests/training/data/everyday_dev2.jsonl --model models/ner
	$(BIN)/spo evaluate tests/training/data/everyday_unseen.jsonl --model models/ner

# The image needs BuildKit (RUN --mount for the CA secret): Debian's docker.io client has it built in;
# another client needs its buildx plugin. IMAGE_ARGS adds build options, e.g.
# IMAGE_ARGS="--build-arg MODELS=my-models --build-arg SPO_MODELS=mine=/models/mine" (docs/deploy.md).
DOCKER     ?= $(firstword $(wildcard /usr/bin/docker) docker)
IMAGE      ?= spo-service:latest
CA_BUNDLE  ?=
IMAGE_ARGS ?=

image:  ## build the container image, tagged spo-service:latest (CA_BUNDLE=/path/ca.pem: a CA bundle for pip)
	@if [ -n "$(CA_BUNDLE)" ] && [ ! -r "$(CA_BUNDLE)" ]; then echo "CA_BUNDLE: cannot read $(CA_BUNDLE)" >&2; exit 2; fi
	DOCKER_BUILDKIT=1 $(DOCKER) build --network host \
		$(if $(CA_BUNDLE),--secret id=ca$(,)src=$(CA_BUNDLE)) $(IMAGE_ARGS) -t $(IMAGE) .

clean:  ## remove caches (keeps .venv)
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis
