from recipes.benchmarks.merge_precision.cli import main


if __name__ == "__main__":
    main()
