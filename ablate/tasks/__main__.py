import sys

from ablate.tasks.export import main

if __name__ == "__main__":
    sys.exit(main())
