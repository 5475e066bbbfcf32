# spo-service developer commands. `make help` lists them.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ONNX_STAMP := $(VENV)/.installed-onnx
SPARK_STAMP := $(VENV)/.installed-spark
QUANTIZE_STAMP := $(VENV)/.installed-quantize

.DEFAULT_GOAL := help
, := ,
.PHONY: help venv extra-onnx extra-spark check format test test-fast serve bench demo-model ner-model image clean

help:  ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

venv: $(STAMP)  ## create .venv from the exact pins (Python 3.11)

$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "spo-service needs Python 3.11 (bert4keras imports distutils)"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.lock
	# bert4keras declares keras<=2.3.1 (unsatisfiable with any TF 2.12+); it has no other dependencies.
	$(BIN)/pip install -q --no-deps bert4keras==0.11.5
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	@touch $@

extra-onnx: $(ONNX_STAMP)  ## install the optional onnx extra (onnx engine, spo export-onnx)

$(ONNX_STAMP): $(STAMP) requirements-onnx.lock
	$(BIN)/pip install -q -r requirements-onnx.lock
	@touch $@

extra-spark: $(SPARK_STAMP)  ## install the optional spark extra (spo spark-extract)

$(SPARK_STAMP): $(STAMP) requirements-spark.lock
	$(BIN)/pip install -q -r requirements-spark.lock
	@touch $@

extra-quantize: $(QUANTIZE_STAMP)  ## install the optional quantize extra (spo quantize)

$(QUANTIZE_STAMP): $(STAMP) requirements-quantize.lock
	$(BIN)/pip install -q -r requirements-quantize.lock
	@touch $@

check: venv  ## lint, format check and type check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: venv  ## apply ruff formatting and safe fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: venv $(ONNX_STAMP) $(SPARK_STAMP) $(QUANTIZE_STAMP)  ## the whole test suite, slow and live tests included
	$(BIN)/pytest

test-fast: venv  ## the suite without slow and live tests
	$(BIN)/pytest -m "not slow and not live"

serve: venv  ## serve models/demo (triples, the default) and models/ner (entities); SPO_* variables configure it
	@if [ -z "$$SPO_MODELS$$SPO_MODEL_DIR" ]; then export SPO_MODELS=demo=models/demo,ner=models/ner; fi; \
	$(BIN)/spo serve

bench: venv $(ONNX_STAMP)  ## run the benchmarks (hours at full counts; BENCH_ARGS="--requests 2000" to reduce; writes bench/results/)
	bash bench/setup.sh
	$(BIN)/python -m bench $(BENCH_ARGS)

demo-model: venv  ## rebuild models/demo exactly as committed (about 25 min on 2 idle CPU cores)
	$(BIN)/spo make-corpus data/train.jsonl --n 48000 --seed 1
	$(BIN)/spo train data/train.jsonl --out models/demo --max-steps 4000 --lr 2e-3 --warmup 300 --dropout 0 --max-minutes 29 --seed 1
	$(BIN)/spo make-corpus data/heldout.jsonl --n 1000 --seed 2 --split heldout
	$(BIN)/spo evaluate data/heldout.jsonl --model models/demo
	$(BIN)/spo evaluate tests/training/data/everyday.jsonl --model models/demo
	$(BIN)/spo evaluate tests/training/data/everyday_unseen.jsonl --model models/demo --format text

ner-model: venv  ## rebuild models/ner (entities) exactly as committed (about 30 min on 2 busy CPU cores)
	$(BIN)/spo make-corpus data/train.jsonl --n 48000 --seed 1
	$(BIN)/spo train data/train.jsonl --task entities --out models/ner --max-steps 3000 --lr 2e-3 --warmup 200 --dropout 0 --max-minutes 65 --seed 1
	$(BIN)/spo make-corpus data/heldout.jsonl --n 1000 --seed 2 --split heldout
	$(BIN)/spo evaluate data/heldout.jsonl --model models/ner

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
