# The two front-door commands are `make serve` and `make test`; each bootstraps its own
# environment (a pinned uv in .tools/, then the locked dependencies in .venv/).
UV_VERSION := 0.13.9
UV := .tools/bin/uv
RUN := $(UV) run --locked

.PHONY: serve test check generate fake-model bench

$(UV):
	python3 -m venv .tools
	.tools/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

serve: $(UV)
	$(RUN) agio-grpc serve

test: $(UV)
	$(RUN) pytest

# Lint, types, layering, contract lint and generated-code drift (CI runs these too).
check: $(UV)
	$(RUN) ruff check .
	$(RUN) ruff format --check .
	$(RUN) mypy
	$(RUN) lint-imports
	$(RUN) buf lint
	$(RUN) buf format --diff --exit-code
	$(RUN) python scripts/generate.py --check

generate: $(UV)
	$(RUN) python scripts/generate.py

fake-model: $(UV)
	$(RUN) agio-grpc fake-model

bench: $(UV)
	$(RUN) python -m bench
