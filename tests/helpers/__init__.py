"""What more than one test module uses. Nothing here is a test, and no test module imports another
(tests/unit/repo/test_suite_layout.py): what two of them share lives here, or in tests/conftest.py where it is a
fixture."""
