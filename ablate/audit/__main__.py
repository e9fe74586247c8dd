import sys

from ablate.audit.cli import main
from ablate.runtime import tune_allocator

if __name__ == "__main__":
    tune_allocator()
    sys.exit(main())
