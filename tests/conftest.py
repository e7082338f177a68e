pytest_plugins = ["tests.fix_servers", "tests.fix_pipeline", "tests.fix_delivery",
                  "tests.fix_sinks", "tests.fix_capture", "tests.fix_mysql", "tests.fix_tls"]
