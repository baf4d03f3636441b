from corral.cli.main import run

run()
