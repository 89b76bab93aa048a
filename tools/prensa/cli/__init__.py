"""The `prensa` command line: one module per command group."""

from __future__ import annotations

import typer

from prensa.cli import deploy, repo
from prensa.cli.bench import bench
from prensa.cli.corpus import embed_corpus
from prensa.cli.export import calibrate, export
from prensa.cli.gateway import gateway
from prensa.cli.loadtest import loadtest
from prensa.cli.serve import serve, up
from prensa.cli.stats import stats
from prensa.cli.tune import tune

app = typer.Typer(help="Serve embedders, rerankers and SPLADE models through NVIDIA Triton.", no_args_is_help=True,
                  context_settings={"auto_envvar_prefix": "PRENSA"})
app.command()(export)
app.command()(calibrate)
app.add_typer(repo.app, name="repo")
app.add_typer(deploy.app, name="deploy")
app.command()(serve)
app.command()(up)
app.command()(gateway)
app.command()(stats)
app.command()(bench)
app.command()(tune)
app.command()(loadtest)
app.command("embed-corpus")(embed_corpus)
