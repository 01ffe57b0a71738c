"""``python -m lit_amp`` is ``lit-amp``."""

from lit_amp.cli import main

main()
