"""Runs one benchmark and prints its summary line last: ``NAME key=value ...``."""

import inspect

from django.core.management.base import BaseCommand, CommandError

from agent import bench


class Command(BaseCommand):
    help = "Run a benchmark (see --list) and print one summary line NAME key=value ..."

    def add_arguments(self, parser):
        parser.add_argument("name", nargs="?", help="benchmark to run")
        parser.add_argument("--list", action="store_true", help="name every benchmark")
        parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
        # Sizes for the benchmarks that take them (release-storm; scale's change rate), to run
        # smaller than the defaults on a small machine.
        for size in ("nodes", "pods", "live"):
            parser.add_argument(f"--{size}", type=int, help=f"{size} (release-storm)")
        parser.add_argument("--rate", type=int, help="changes offered per second (scale)")

    def handle(self, *args, **options):
        if options["list"]:
            for name, (_, _, description) in sorted(bench.REGISTRY.items()):
                self.stdout.write(f"{name:20} {description}")
            return
        name = options["name"]
        if not name:
            raise CommandError("name a benchmark, or --list to see them")
        if name not in bench.REGISTRY:
            raise CommandError(f"no benchmark {name!r}; known: {', '.join(sorted(bench.REGISTRY))}")
        sizes = {k: options[k] for k in ("nodes", "pods", "live", "rate") if options[k] is not None}
        run = bench.load(name)
        unknown = set(sizes) - set(inspect.signature(run).parameters)
        if unknown:
            raise CommandError(f"{name} takes no {', '.join('--' + k for k in sorted(unknown))}")
        negative = sorted(k for k, v in sizes.items() if v < (0 if k == "live" else 1))
        if negative:
            raise CommandError(
                f"{name}: {', '.join(f'--{k} {sizes[k]}' for k in negative)}: "
                "nodes, pods and rate must be at least 1, live at least 0"
            )
        figures = run(quick=options["quick"], stdout=self.stdout, **sizes)
        self.stdout.write(bench.summary(name, figures))
