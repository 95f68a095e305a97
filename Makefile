# The two front-door commands are `make serve` and `make test`; each bootstraps its own
# environment (a pinned uv in .tools/, then the locked dependencies in .venv/).
UV_VERSION := 0.13.9
UV := .tools/bin/uv
RUN := $(UV) run --locked
RUNTIME_RUN := $(UV) run --locked --no-default-groups
# Installed packages get their bytecode at install: every later process (the server, each
# test subprocess, the CLI) then starts without compiling them again, about 3 s less each
# on a machine that sets PYTHONDONTWRITEBYTECODE.
export UV_COMPILE_BYTECODE := 1
# The project's own modules get theirs on first import, and pytest keeps its assertion-
# rewritten test modules the same way (both in __pycache__/, ignored by git): a test worker,
# and each server or CLI process a test starts, then skips the compile. An empty value is
# unset to Python.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: serve test test-slow tokenizers fuzz check generate protoset fake-model bench breaking contract-baseline clients conformance

$(UV):
	python3 -m venv .tools
	.tools/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# tiktoken's encodings for OpenAI models' token counts (engine/tokens.py), fetched once into
# .tools/tiktoken; without them counts are estimated from characters, so a failure to fetch
# them stops nothing (docs/compaction.md).
export TIKTOKEN_CACHE_DIR := $(CURDIR)/.tools/tiktoken
# o200k_base's file as tiktoken names it (engine/tokens.py): once it is there, nothing runs.
TIKTOKEN_MARK := $(TIKTOKEN_CACHE_DIR)/fb374d419588a4632f3f557e76b4b70aebbca790
tokenizers: $(TIKTOKEN_MARK)
$(TIKTOKEN_MARK): | $(UV)
	-$(RUNTIME_RUN) python scripts/tokenizers.py $(TIKTOKEN_CACHE_DIR)

# The service needs the runtime dependencies only: the development and benchmark groups
# (pytest, linters, buf, the Agents SDK, matplotlib) come with `make test`. It also serves
# Connect and gRPC-Web for browsers on AGIO_HTTP_ADDRESS (`make serve AGIO_HTTP_ADDRESS=`
# turns that off; docs/browsers.md).
AGIO_HTTP_ADDRESS ?= 127.0.0.1:8080
serve: $(UV) tokenizers
	AGIO_HTTP_ADDRESS=$(AGIO_HTTP_ADDRESS) $(RUNTIME_RUN) agio-grpc serve

# The default suite, in TEST_WORKERS pytest-xdist processes (most of a test is waiting on a
# server, a database or the fake model, so more processes than cores pay); the slow one (real
# server processes killed and restarted, benchmark smoke runs) is `make test-slow`, one
# process at a time. CI runs both.
TEST_WORKERS ?= 4
test: $(UV) tokenizers
	$(RUN) python -m compileall -q agio_grpc tests
	$(RUN) pytest -m "not slow" -n $(TEST_WORKERS)

test-slow: $(UV)
	$(RUN) pytest -m slow

# The adversarial suite at length: 10,000 request cases and 1,000 model streams per backend,
# random each run, with a summary of cases and status codes at the end (`make test` runs the
# same properties with a few deterministic examples). Both backends at once, in four
# processes (scripts/fuzz.py).
fuzz: $(UV)
	$(RUN) python scripts/fuzz.py

# Lint, types, layering, contract lint and generated-code drift (CI runs these too).
check: $(UV)
	$(RUN) ruff check .
	$(RUN) ruff format --check .
	$(RUN) mypy
	$(RUN) lint-imports
	$(RUN) buf lint
	$(RUN) buf format --diff --exit-code
	$(RUN) python scripts/generate.py --check

# Python, Go and TypeScript code from proto/ (installs the pinned Go and npm plugins first).
generate: $(UV)
	$(RUN) python scripts/generate.py

# The contract as one FileDescriptorSet (imports and comments included), agio.protoset, for
# grpcurl and ghz `-protoset` (docs/grpcurl.md); the server's reflection serves the same.
protoset: $(UV)
	$(RUN) python scripts/protoset.py

# The contract against the last released one (.ci/contract-baseline.binpb); the baseline must
# hold the agio.v1 files, so the comparison cannot pass against an empty image.
breaking: $(UV)
	$(RUN) buf ls-files .ci/contract-baseline.binpb | grep -qx agio/v1/agent_service.proto
	$(RUN) buf breaking --against .ci/contract-baseline.binpb

# After a contract change lands on main (or a deliberate break is accepted): new baseline.
contract-baseline: $(UV)
	$(RUN) buf build --exclude-source-info -o .ci/contract-baseline.binpb

# Build and unit-test the Go and TypeScript clients and examples.
clients:
	cd clients/go && go vet ./... && go test ./...
	cd clients/ts && npm ci --no-audit --no-fund && npm run build
	cd examples && go vet ./... && go test ./...
	cd examples/ts && npm ci --no-audit --no-fund && npm run build

# The conformance scenario with the Python, Go and TypeScript clients against live servers.
conformance: $(UV)
	$(RUN) python scripts/conformance.py

fake-model: $(UV)
	$(RUNTIME_RUN) agio-grpc fake-model

bench: $(UV)
	$(RUN) python -m bench
