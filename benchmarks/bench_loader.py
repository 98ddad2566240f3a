"""dsc.Loader epoch throughput vs the copy limit and a PIL-decoding torch DataLoader (same run)."""
from common import compiled_224


def main() -> None:
    from dsc.bench import run_bench

    path = compiled_224()
    for order in ("random", "quasi_random"):
        run_bench(path, batch_size=256, order=order)


if __name__ == "__main__":
    main()
