.PHONY: install run test check fix

install:
	bash scripts/install.sh

# The default job: DAPO on the embedded model and task (the install's seconds go into the run's wall account).
run:
	@start=$$(date +%s.%N); bash scripts/install.sh; \
	  export COATI_INSTALL_S=$$(python -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" $$start); \
	  set -x; HF_HUB_OFFLINE=1 python rl_example.py --algo DAPO

test:
	bash scripts/install.sh test
	HF_HUB_OFFLINE=1 python -m pytest -q --durations=20 tests

# Formatting, lint, import layers and types (ruff.toml, .importlinter, mypy.ini); the docs' code blocks that show a source file, the
# generated configuration reference, the pages' shape (an example first, short paragraphs, lists that render), and
# the documentation site built with every link checked.
check:
	python -m pip --disable-pip-version-check -q install -r requirements-dev.txt
	ruff format --check .
	ruff check .
	lint-imports
	mypy
	python scripts/doc_sources.py --check
	python scripts/reference_pages.py --check
	python scripts/doc_style.py --check
	NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir /tmp/coati-site

# What check's formatter and linter can repair, repaired in place.
fix:
	ruff format .
	ruff check --fix .
