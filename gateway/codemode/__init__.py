"""Code mode: the model writes one program against every tool, run in a sandbox (docs/code-mode.md).

- `sandbox`: the pool of monty worker processes and a run's limits, each named when hit;
- `program_api`: the tool API a program sees (`tools.<name>(...)`, `call_tool(name, args)`);
- `write_gate`: only read-only tools inside a program, unless the operator or, once per run, the client allows more;
- `signatures`: typed signatures from tools' schemas (`describe_tools`);
- `report`: what the model gets back;
- `service`: `CodeMode`, what the serving layer calls.

Every inner call goes through the registry's ordinary call chain with the caller of `execute`.
"""

from gateway.codemode.program_api import ProgramTools, result_value
from gateway.codemode.report import PROGRAM_ERROR, PROGRAM_LIMIT, program_result
from gateway.codemode.sandbox import ProgramError, RunOutcome, SandboxPool
from gateway.codemode.service import CodeArgumentError, CodeMode, parse_names, parse_program
from gateway.codemode.signatures import signature
from gateway.codemode.write_gate import ConfirmWrites, RunWrites, WriteGate, read_only

__all__ = [
    "PROGRAM_ERROR",
    "PROGRAM_LIMIT",
    "CodeArgumentError",
    "CodeMode",
    "ConfirmWrites",
    "ProgramError",
    "ProgramTools",
    "RunOutcome",
    "RunWrites",
    "SandboxPool",
    "WriteGate",
    "parse_names",
    "parse_program",
    "program_result",
    "read_only",
    "result_value",
    "signature",
]
