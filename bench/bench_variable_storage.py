"""How big a trajectory line is when an agent emits one big semantic variable and then makes 20
calls: every step's variables written whole (as before) against written once per change (now),
measured in one run; and whether a 7 MB variable is taken at all (``max_variable_bytes``).

    python bench/bench_variable_storage.py [BYTES]      # default 900000
"""

from __future__ import annotations

import sys

from agentgym_lightning.env import AgentEnv


def run(size: int) -> tuple[object, str | None]:
    refused: list[str] = []

    def agent(task, ctx):
        for i in range(20):
            ctx.chat_completion([{"role": "user", "content": "q"}])
            if i == 0:
                try:
                    ctx.emit_variable("blob", "x" * size)
                except ValueError as exc:
                    refused.append(str(exc))

    env = AgentEnv(agent, [{}], lambda task, result: 1.0)
    env.reset(seed=0)
    while True:
        *_, terminated, truncated, info = env.step("a")
        if terminated or truncated:
            env.close()
            return info["trajectory"], (refused[0] if refused else None)


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 900_000
    trajectory, _ = run(size)
    now = len(trajectory.to_json(compact=True).encode())  # the file's line: each step as what it adds
    before = len(trajectory.to_json().encode())  # every step in full
    print(f"{size / 1e6:.1f} MB variable x 20 calls: line {before / 1e6:.1f} MB whole -> {now / 1e6:.1f} MB "
          f"as changes ({before / now:.1f}x smaller)")
    _, refused = run(7_000_000)
    print(f"7.0 MB variable: {'refused: ' + refused[:80] if refused else 'taken'}")


if __name__ == "__main__":
    main()
