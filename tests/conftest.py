pytest_plugins = ["tests.fix_servers"]
