"""Test doubles and bench helpers: used by tests/ and bench/, never installed with the package.

`scripts/bootstrap.sh` puts `tests/` on the development virtualenv's path (a .pth file), and
pytest adds it too (`pythonpath` in pyproject.toml), so `import egpu_testing` works in both.
"""
