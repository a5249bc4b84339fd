"""Runs one benchmark and prints its summary line last: ``NAME key=value ...``."""

from django.core.management.base import BaseCommand, CommandError

from agent import bench


class Command(BaseCommand):
    help = "Run a benchmark (see --list) and print one summary line NAME key=value ..."

    def add_arguments(self, parser):
        parser.add_argument("name", nargs="?", help="benchmark to run")
        parser.add_argument("--list", action="store_true", help="name every benchmark")
        parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")

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
        figures = bench.load(name)(quick=options["quick"], stdout=self.stdout)
        self.stdout.write(bench.summary(name, figures))
