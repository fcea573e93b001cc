"""An MCP server as a user writes one, with the mcp SDK's own server (``MCPServer``, v1's FastMCP), over stdio.

It offers ``calculate(expression)``: integers with + - * / and parentheses, evaluated exactly by its own small
evaluator (nothing of ragen's). Run as ``python mcp_calculator_server.py [TAG] [--extras]``: ``TAG`` only marks the
process for the tests' ``ps``; ``--extras`` adds ``wait(seconds)`` (a slow tool), ``crash()`` (the process exits
at once) and ``variable(name)`` (the value of one of the server's environment variables: an argument named ``name``,
and what ``env.mcp.pass_env`` passed). Each call of ``calculate`` is appended to the file ``MCP_CALL_LOG`` names,
when set, as a JSON line ``{"expression": ..., "result": ...}`` (the result, or ``error: ...``), so a test sees what
the server itself did.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import time
from fractions import Fraction

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("calculator")
OPERATIONS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATIONS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ToolError("division by zero")
        return OPERATIONS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    raise ToolError("only integers, + - * / and parentheses")


def _log(expression: str, result: str) -> None:
    path = os.environ.get("MCP_CALL_LOG")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({"expression": expression, "result": result}) + "\n")


@server.tool()
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly (served over MCP).

    Args:
        expression: integers with + - * / and parentheses, e.g. (1200 + 34) * 2
    """
    try:
        value = _value(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ToolError) as exc:
        _log(expression, f"error: {exc}")
        if isinstance(exc, ToolError):
            raise
        raise ToolError(f"{expression!r} is not an arithmetic expression") from None
    result = str(value.numerator) if value.denominator == 1 else str(float(value))
    _log(expression, result)
    return result


def wait(seconds: float) -> str:
    """Wait, then say so."""
    time.sleep(seconds)
    return f"waited {seconds:g} s"


def crash() -> str:
    """End the server's process at once."""
    print("crash: exiting now", file=sys.stderr, flush=True)
    os._exit(3)


def variable(name: str) -> str:
    """The value of the server's environment variable ``name``, or ``<unset>``."""
    return os.environ.get(name, "<unset>")


if __name__ == "__main__":
    if "--extras" in sys.argv:
        server.add_tool(wait)
        server.add_tool(crash)
        server.add_tool(variable)
    server.run("stdio")
