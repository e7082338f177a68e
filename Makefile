# Tailrace developer entry points. `make run` and `make test` do all set-up themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.tailrace-installed
PROTOS := $(wildcard protos/tailrace/v1/*.proto)
GEN    := libs/tailrace/proto/control_pb2.py

.PHONY: setup run test test-fast lint protos secrets clean

CDS    := $(VENV)/share/tailrace/spark-driver.jsa

setup: $(STAMP) $(GEN) $(CDS)

$(STAMP): pyproject.toml setup.py libs/tailrace/events/_cwire.c libs/tailrace/events/_cjson.c libs/tailrace/events/_cbuf.h tools/install_system_deps.sh
	bash tools/install_system_deps.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

$(GEN): $(PROTOS) tools/gen_protos.py $(STAMP)
	$(PY) tools/gen_protos.py

## The delivery driver JVM's class-data archive: every Spark start ~3-4 s sooner. Without
## it delivery still works (slower to start), so a failure here does not fail the setup.
$(CDS): $(STAMP) $(GEN)
	$(VENV)/bin/tailrace-spark archive || echo "make: no class-data archive; delivery starts without it"

protos: $(STAMP)
	$(PY) tools/gen_protos.py

## Throwaway PostgreSQL, broker, Redis, NATS + the three services on a sample pipeline.
## DURATION=60 makes it stop by itself a minute after the first changes arrive.
run: setup
	$(VENV)/bin/tailrace demo $(if $(DURATION),--duration $(DURATION)) $(if $(DEMO_DIR),--dir $(DEMO_DIR))

## The tests run on TEST_WORKERS processes (pytest-xdist; an idle worker takes tests queued
## for a busy one; each worker starts its own throwaway servers). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: setup lint
	$(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist worksteal) $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

## Random service and admin tokens, PostgreSQL and MySQL passwords for docker-compose.yml (kept if
## they exist; never in git).
secrets:
	@mkdir -p deploy/secrets && chmod 700 deploy/secrets
	@# tokens 0644 in a 0700 dir: private on this host, readable by the image's non-root user
	@# where compose mounts them; the .env files are read by compose itself, so they stay 0600
	@for role in service admin; do f=deploy/secrets/$$role.token; \
	  if [ ! -s $$f ]; then (umask 022; $(PYTHON) -c 'import secrets; print(secrets.token_hex(32))' > $$f); \
	  echo "wrote $$f"; fi; chmod 644 $$f; done
	@f=deploy/secrets/postgres.env; if [ ! -s $$f ]; then (umask 077; $(PYTHON) -c 'import secrets; \
	  p = secrets.token_hex(24); \
	  print(f"POSTGRES_PASSWORD={p}\nPG_DSN=postgresql://postgres:{p}@postgres:5432/shop")' > $$f); \
	  echo "wrote $$f"; fi
	@f=deploy/secrets/control.env; if [ ! -s $$f ]; then (umask 077; . deploy/secrets/postgres.env; \
	  echo "TAILRACE_CONTROL_STORAGE=postgresql://postgres:$$POSTGRES_PASSWORD@postgres:5432/tailrace_control" > $$f); \
	  echo "wrote $$f"; fi
	@f=deploy/secrets/mysql.env; if [ ! -s $$f ]; then (umask 077; $(PYTHON) -c 'import secrets; \
	  p = secrets.token_hex(24); \
	  print(f"MYSQL_ROOT_PASSWORD={p}\nMYSQL_DSN=mysql://root:{p}@mysql:3306/shop")' > $$f); \
	  echo "wrote $$f"; fi

## ruff, then mypy --strict on the tailrace and tailrace_services packages ([tool.mypy]).
lint: setup
	$(VENV)/bin/ruff check libs services tests tools bench
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .tailrace .mypy_cache libs/tailrace/proto/*_pb2*.py libs/tailrace/proto/*_pb2*.pyi
