import sys

from recipes.benchmarks.demo_report.cli import main


if __name__ == "__main__":
    sys.exit(main())
