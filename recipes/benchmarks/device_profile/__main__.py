from recipes.benchmarks.device_profile.cli import main


if __name__ == "__main__":
    main()
