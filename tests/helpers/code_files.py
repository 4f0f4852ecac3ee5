"""Python source files for the code-corpus tests."""


def python_source(i: int) -> str:
    return (
        f"import os\n\n\nclass Widget{i}:\n    \"\"\"A widget number {i}.\"\"\"\n\n"
        f"    def __init__(self, size: int = {i}) -> None:\n        self.size = size\n\n"
        f"    def area(self) -> int:\n        return self.size * self.size + {i}\n\n\n"
        f"def helper_{i}(path):\n    for name in os.listdir(path):\n        if name.endswith('.py'):\n"
        f"            yield os.path.join(path, name)\n"
    )
