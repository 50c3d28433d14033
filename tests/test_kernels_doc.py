"""Every ```python block of docs/kernels.md runs as written (CPU, small shapes) and ends with an
assert against a reference."""

import ast
import re
from pathlib import Path

import pytest
import torch

DOC = Path(__file__).resolve().parents[1] / "docs" / "kernels.md"


def _snippets() -> list[tuple[str, int, str]]:
    """``(id, first line, code)`` of each python block; the id names its section headings."""
    snippets, headings, block, start = [], {}, None, 0
    for number, line in enumerate(DOC.read_text().splitlines(), start=1):
        if block is not None:
            if line.startswith("```"):
                name = "/".join(headings[level] for level in sorted(headings))
                snippets.append((name, start, "\n".join(block) + "\n"))
                block = None
            else:
                block.append(line)
        elif line.startswith("```python"):
            block, start = [], number + 1
        elif heading := re.match(r"(#{2,3}) (.*)", line):
            level = len(heading[1])
            headings = {k: v for k, v in headings.items() if k < level}
            headings[level] = re.sub(r"[^A-Za-z0-9_]+", "-", heading[2]).strip("-")
    return snippets


SNIPPETS = _snippets()


def test_the_doc_has_a_snippet_for_every_op():
    code = "".join(snippet for _, _, snippet in SNIPPETS)
    for op in ("diffusion_nft_loss", "worldcompass_nft_loss", "nft_loss", "flow_noise",
               "prefix_attention", "grpo_sde_loss", "sde_log_prob"):
        assert f"{op}(" in code, op


@pytest.mark.parametrize("first_line, code", [s[1:] for s in SNIPPETS],
                         ids=[s[0] for s in SNIPPETS])
def test_snippet_runs_and_checks_itself(first_line, code):
    tree = ast.parse(code)
    assert isinstance(tree.body[-1], ast.Assert), "a snippet ends with its check"
    torch.manual_seed(0)
    # blank lines first, so that a traceback names the line of docs/kernels.md
    compiled = compile("\n" * (first_line - 1) + code, str(DOC), "exec")
    exec(compiled, {"__name__": "docs_kernels_snippet"})
