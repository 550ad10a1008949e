"""``python -m nvmlsim``: see :mod:`nvmlsim.launcher`."""

from nvmlsim.launcher import main

if __name__ == "__main__":
    raise SystemExit(main())
