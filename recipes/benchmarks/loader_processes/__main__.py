import sys

from recipes.benchmarks.loader_processes.cli import main


if __name__ == "__main__":
    sys.exit(main())
