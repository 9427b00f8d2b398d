from recipes.benchmarks.distributed_costs.cli import main


if __name__ == "__main__":
    main()
