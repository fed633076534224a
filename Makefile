# Two entry points, both self-contained on a fresh machine (see README.md):
#   make run   - set up, then run the main job (kafka-txn demo: crashes injected, verified)
#   make test  - set up, then run the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test lint bench docs databases conformance-matrix

setup: $(STAMP)

# PostgreSQL and MariaDB for the tests: installed from Debian's packages when absent (as
# root), started when down, a `test` database in each (scripts/test-databases).
databases:
	scripts/test-databases

# Versions are pinned by constraints.txt so that CI and every machine test the same set.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,lint]'
	touch $(STAMP)

run: setup
	$(VENV)/bin/kafka-txn demo

# The whole suite, on Apache Kafka from Maven when Java and Maven are here (tests/support/rig.py
# says the order; the run's header and summary name the broker that ran).
test: setup databases
	$(PY) -m pytest

# The broker-facing tests (-m conformance) of the core modules on the other brokers CI
# covers: Apache Kafka formatted with transaction.version 0 (no KIP-890 part 2), and
# noida-db (no Java). Every other module runs once, in make test; to run every
# broker-facing test on both: make conformance-matrix MATRIX_TESTS='-m conformance'.
MATRIX_MODULES := producer/test_producer twophase/test_two_phase twophase/test_prepare_identity \
	twophase/test_recovery dualwrite/test_writer eos/test_eos broker/test_broker \
	broker/test_kafka_fidelity
MATRIX_TESTS ?= -m conformance $(MATRIX_MODULES:%=tests/%.py)
# The two legs run at once (each starts its own broker on free ports; the tests' tables and
# transactional ids are unique per run), each into its own log, printed when both end.
conformance-matrix: setup databases
	mkdir -p build
	KAFKA_TXN_TRANSACTION_VERSION=0 $(PY) -m pytest -p no:cacheprovider $(MATRIX_TESTS) \
		> build/matrix-tv0.log 2>&1 & tv0=$$!; \
	KAFKA_TXN_TEST_BROKER=noida $(PY) -m pytest -p no:cacheprovider $(MATRIX_TESTS) \
		> build/matrix-noida.log 2>&1 & noida=$$!; \
	wait $$tv0; tv0_rc=$$?; wait $$noida; noida_rc=$$?; \
	cat build/matrix-tv0.log build/matrix-noida.log; \
	echo "conformance-matrix: transaction.version 0 exit $$tv0_rc, noida-db exit $$noida_rc"; \
	test $$tv0_rc -eq 0 && test $$noida_rc -eq 0

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --strict kafka_txn

# Every benchmark, each against its raw confluent-kafka baseline in the same run, on the
# test rig's broker (tests/support/rig.py's order: Apache Kafka from Maven when Java and Maven are
# here), which each one names; KAFKA_TXN_TEST_BROKER=noida make bench runs them on
# noida-db (docs/performance.md).
bench: setup databases
	$(PY) bench/producer_bench.py
	$(PY) bench/two_phase_bench.py
	$(PY) bench/dual_write_bench.py
	$(PY) bench/dual_write_bench.py --failure-path --rows 1 10
	$(PY) bench/spark_sink_bench.py
	$(PY) bench/recovery_bench.py
	$(PY) bench/async_bench.py

# The docs generated from the code (kafka_txn/_docs.py), and docs/reference/proofs.md from the
# tests' @pytest.mark.guarantee markers (tests/support/proofs.py).
docs: setup
	$(PY) -m kafka_txn._docs
	$(PY) -m tests.support.proofs

# The Spark tests against the oldest pyspark the [spark] extra admits (pyspark>=3.5 in
# pyproject.toml), in a virtualenv of their own; `make test` runs them against the newest,
# pinned in constraints.txt. Same pins otherwise (pyspark and its py4j aside).
SPARK_OLDEST ?= 3.5.0
SPARK_VENV ?= $(VENV)/spark-oldest
SPARK_STAMP := $(SPARK_VENV)/.installed-$(SPARK_OLDEST)

.PHONY: test-spark-oldest
$(SPARK_STAMP): pyproject.toml constraints.txt
	test -x $(SPARK_VENV)/bin/python || $(PYTHON) -m venv $(SPARK_VENV)
	$(SPARK_VENV)/bin/python -m pip install --quiet --upgrade pip
	grep -v -E '^(pyspark|py4j)==' constraints.txt > $(SPARK_VENV)/constraints.txt
	$(SPARK_VENV)/bin/python -m pip install --quiet -c $(SPARK_VENV)/constraints.txt \
		-e '.[test]' 'pyspark==$(SPARK_OLDEST)'
	touch $(SPARK_STAMP)

test-spark-oldest: $(SPARK_STAMP)
	$(SPARK_VENV)/bin/python -m pytest tests/spark

# The soaks, SOAK_SECONDS (default 600) per schedule instead of the seconds they get in
# `make test`: the dual-write adversary (tests/dualwrite/test_soak.py, per database;
# KAFKA_TXN_ADVERSARY_SEED picks its schedule), then the broker-fault schedules on the
# three-broker cluster (tests/cluster/; KAFKA_TXN_CLUSTER_SEED picks theirs), whose
# figures go to build/cluster-soak.jsonl and are printed as the table of docs/guarantees.md.
SOAK_SECONDS ?= 600
.PHONY: soak
soak: setup databases
	KAFKA_TXN_SOAK_SECONDS=$(SOAK_SECONDS) $(PY) -m pytest tests/dualwrite/test_soak.py
	mkdir -p build && rm -f build/cluster-soak.jsonl
	KAFKA_TXN_CLUSTER_SECONDS=$(SOAK_SECONDS) KAFKA_TXN_CLUSTER_EVERY_STEP=1 \
		KAFKA_TXN_CLUSTER_REPORT=build/cluster-soak.jsonl \
		$(PY) -m pytest tests/cluster
	$(PY) -m tests.support.cluster_figures build/cluster-soak.jsonl

# Mutation testing (tests/support/mutants.py; not part of `make test`): mutmut mutates one module
# at a time in a copy of this checkout and runs the tests that state its guarantees.
# `make mutants` runs the fast targets (recovery, lifecycle, classification: about an hour
# on 2 cores); MUTANTS="twophase dualwrite producer" or MUTANTS=all for the broker-bound
# ones (hours). Results: build/mutants/<target>/summary.json and survivors.txt.
MUTANTS ?=
MUTATION_STAMP := $(VENV)/.installed-mutation

.PHONY: mutants
$(MUTATION_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,lint,mutation]'
	touch $(MUTATION_STAMP)

mutants: $(MUTATION_STAMP)
	$(PY) -m tests.support.mutants $(MUTANTS)
