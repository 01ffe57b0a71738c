"""``python -m lit_amp`` is the ``lit-amp`` command (see :mod:`lit_amp.cli`)."""

from lit_amp.cli import main

if __name__ == "__main__":
    main()
