from recipes.benchmarks.fault_soak.cli import main


if __name__ == "__main__":
    main()
