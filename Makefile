.PHONY: install run test check

install:
	bash scripts/install.sh

# The default job: DAPO on the embedded model and task.
run: install
	HF_HUB_OFFLINE=1 python rl_example.py --algo DAPO

test:
	bash scripts/install.sh test
	HF_HUB_OFFLINE=1 python -m pytest -q --durations=20 tests

# Formatting, lint and import layers (ruff.toml, .importlinter); the docs' code blocks that show a source file.
check:
	python -m pip --disable-pip-version-check -q install -r requirements-dev.txt
	ruff format --check .
	ruff check .
	lint-imports
	python scripts/doc_sources.py --check
