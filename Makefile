.PHONY: install run test

install:
	bash scripts/install.sh

# The default job: DAPO on the embedded model and task.
run: install
	HF_HUB_OFFLINE=1 python rl_example.py --algo DAPO

test:
	bash scripts/install.sh test
	HF_HUB_OFFLINE=1 python -m pytest -q --durations=20 tests
