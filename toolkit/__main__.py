"""``python -m toolkit`` runs the ``toolkit`` command line."""
from toolkit.core.cli import main

if __name__ == "__main__":
    main()
