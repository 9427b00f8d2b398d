from recipes.benchmarks.goodput_report.cli import main


if __name__ == "__main__":
    main()
