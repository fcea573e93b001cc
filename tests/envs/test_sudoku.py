"""``sudoku``: RAGEN-2's Sudoku at its HEAD (ragen/env/sudoku/ at 20daedc). Checked against boards worked by hand, an
independent solution counter, and a port of RAGEN-2's step and render code written in this file."""

import re

import numpy as np
import pytest

from ragen_core.envs import make_env
from ragen_core.envs.sudoku import SudokuPuzzle, generate_puzzle

# 4x4, solved grid worked by hand; given cells: row 1 "1 2 . .", row 2 ". . 1 2", row 3 "2 . 4 .", row 4 ". 3 . 1".
SOLUTION = (1, 2, 3, 4, 3, 4, 1, 2, 2, 1, 4, 3, 4, 3, 2, 1)
PUZZLE = (1, 2, 0, 0, 0, 0, 1, 2, 2, 0, 4, 0, 0, 3, 0, 1)


def _valid_grid(grid, size: int) -> bool:
    """Every row, column and box holds 1..size once (direct check)."""
    box = int(size**0.5)
    units = [[r * size + c for c in range(size)] for r in range(size)]
    units += [[r * size + c for r in range(size)] for c in range(size)]
    units += [
        [(br + r) * size + bc + c for r in range(box) for c in range(box)]
        for br in range(0, size, box)
        for bc in range(0, size, box)
    ]
    return all(sorted(grid[i] for i in unit) == list(range(1, size + 1)) for unit in units)


def _solutions(grid, size: int, limit: int = 3) -> list[list[int]]:
    """Up to ``limit`` solutions of ``grid`` by plain row-major backtracking."""
    grid, found = list(grid), []

    def search(i: int) -> None:
        while i < size * size and grid[i]:
            i += 1
        if i == size * size:
            found.append(list(grid))
            return
        for v in range(1, size + 1):
            grid[i] = v
            if _valid_partial(grid, size, i):
                search(i + 1)
            grid[i] = 0
            if len(found) >= limit:
                return

    search(0)
    return found


def _valid_partial(grid, size: int, i: int) -> bool:
    box, (r, c) = int(size**0.5), divmod(i, size)
    peers = {r * size + k for k in range(size)} | {k * size + c for k in range(size)}
    peers |= {(r // box * box + a) * size + c // box * box + b for a in range(box) for b in range(box)}
    return all(grid[p] != grid[i] for p in peers - {i})


@pytest.mark.parametrize(
    ("size", "difficulty", "empty"),
    [(9, "easy", 32), (9, "medium", 40), (9, "hard", 48), (4, "easy", 6), (4, "medium", 8), (4, "hard", 9)],
)
def test_puzzles_empty_ragens_share_of_a_valid_grid(size, difficulty, empty):
    # int(81 * 0.4) = 32, int(81 * 0.5) = 40, int(81 * 0.6) = 48; int(16 * 0.4) = 6, 8, int(16 * 0.6) = 9
    grids, puzzles = set(), set()
    for seed in range(60):
        puzzle = generate_puzzle(seed, size, difficulty)
        assert _valid_grid(puzzle.solution, size)
        assert all(p in (0, s) for p, s in zip(puzzle.puzzle, puzzle.solution, strict=True))
        assert puzzle.puzzle.count(0) == empty
        grids.add(puzzle.solution)
        puzzles.add(puzzle.puzzle)
    # a 4x4 has only 288 solved grids, so some repeat; the emptied cells still differ
    assert len(grids) == 60 if size == 9 else len(puzzles) >= 58


def test_no_uniqueness_check_and_any_solution_counts():
    ambiguous = [s for s in range(40) if len(_solutions(generate_puzzle(s, 4, "hard").puzzle, 4)) > 1]
    assert ambiguous, "RAGEN-2 keeps puzzles with several solutions; 4x4 hard (9 of 16 empty) has some"
    env = make_env("sudoku", size=4, difficulty="hard")
    env.reset(ambiguous[0])
    other = next(g for g in _solutions(env.instance.puzzle, 4) if tuple(g) != env.instance.solution)
    total, cells = 0.0, [i for i, v in enumerate(env.instance.puzzle) if v == 0]
    for i in cells:
        _, reward, terminated, _, info = env.step(f"{i // 4 + 1},{i % 4 + 1},{other[i]}")
        total += reward
    differ = sum(other[i] != env.instance.solution[i] for i in cells)
    assert terminated and info["success"] and differ > 0
    assert total == pytest.approx((len(cells) - differ) * 1.0 + differ * 0.5 + 10)


def _hand_env(**options):
    env = make_env("sudoku", size=4, **options)
    env.load_puzzle(SudokuPuzzle(4, PUZZLE, SOLUTION))
    return env


def test_rewards_and_feedback_by_hand():
    env = _hand_env()
    # a given cell, a clash (3 sits in row 4 and in box (2,1)), a malformed item, an out-of-range row
    cases = [
        ("1,1,1", "\u274c Cannot modify initial cell at (1,1)"),
        ("4,1,3", "\u274c Invalid placement: 3 conflicts with row 4, box (2,1)\n   Valid numbers for (4,1): [4]"),
        (
            "1 3 3",
            "\u274c Invalid action format: Could not parse action: '1 3 3'. Expected format: "
            "'place 5 at row 2 col 3' or '2,3,5'",
        ),
        ("5,1,1", "\u274c Invalid action format: Row 5 is out of range (1-4)"),
    ]
    for action, feedback in cases:
        _, reward, terminated, truncated, info = env.step(action)
        assert (reward, terminated, truncated, info["action_is_valid"]) == (-0.1, False, False, False)
        assert env.feedback == feedback and env.board == list(PUZZLE)
    _, reward, *_ = env.step("place 3 at row 1 col 3")  # the solution's value
    assert reward == 1.0 and env.feedback == "\u2713 Correct! Placed 3 at (1,3)"
    _, reward, *_, info = env.step("2,1,4")  # 4 repeats nothing there, but the solution has 3
    assert (reward, info["action_is_valid"], info["correct_placement"]) == (0.5, True, False)
    assert env.feedback == "\u26a0 Placed 4 at (2,1) - Valid but not optimal"
    _, reward, *_, info = env.step("2,1,4")  # the same value again repeats itself: invalid
    assert (reward, info["action_is_valid"]) == (-0.1, False)
    assert env.feedback.startswith("\u274c Invalid placement: 4 conflicts with row 2, column 1, box (1,1)")
    assert env.step("2,1,3")[1] == 1.0  # a placed value may be overwritten
    for action in ("1,4,4", "2,2,4", "3,2,1", "3,4,3", "4,1,4"):
        _, reward, terminated, *_ = env.step(action)
        assert (reward, terminated) == (1.0, False)
    _, reward, terminated, truncated, info = env.step("4,3,2")
    assert (reward, terminated, truncated, info["success"]) == (11.0, True, False, True)
    assert env.feedback == "\u2713 Correct! Placed 2 at (4,3)\n\U0001f389 Congratulations! Puzzle solved!"
    with pytest.raises(RuntimeError, match="over"):
        env.step("1,1,1")


def test_render_by_hand():
    env = _hand_env()
    env.step("2,1,4")
    assert env.render() == "\n".join(
        [
            "=" * 50,
            "SUDOKU PUZZLE",
            "=" * 50,
            "[1][2]|  .  .",
            " 4  . | [1][2]",
            "-------------",
            "[2] . | [4] .",
            " . [3]|  . [1]",
            "",
            "Legend: [N]=initial cell, N=user-placed, *N*=conflict, .=empty",
            "",
            "\u26a0 Placed 4 at (2,1) - Valid but not optimal",
            "",
            "\U0001f4a1 VALID NUMBERS FOR EMPTY CELLS:",
            "  - (1,3): [3]",
            "  - (1,4): [3, 4]",
            "  - (3,2): [1]",
            "  - (3,4): [3]",
            "  - (4,3): [2]",
            # (2,2) and (4,1) can take nothing now: the wrong 4 at (2,1) blocks the 4 each of them needs
            "",
            "Progress: 9/16 cells filled (8 initial, 1 placed)",
            "Steps: 1/81",
        ]
    )
    assert _hand_env(render_format="simple").render() == "1 2 | . .\n. . | 1 2\n---------\n2 . | 4 .\n. 3 | . 1"
    detailed = _hand_env(render_format="detailed").render().split("\n")
    assert detailed[3:5] == ["[1][2]|  .  .", " .  . | [1][2]"] and detailed[-1].startswith("Legend")


def test_truncated_after_max_steps_whatever_the_action():
    env = make_env("sudoku", max_steps=3)
    env.reset(1)
    assert [env.step("garbage")[3] for _ in range(3)] == [False, False, True]
    with pytest.raises(RuntimeError, match="over"):
        env.step("1,1,1")


def test_parse_action_reads_ragens_forms_and_passes_the_rest_on():
    env = make_env("sudoku")
    env.reset(0)
    forms = [
        "place 5 at row 2 col 3",
        "Place 5 at (2, 3)",
        "place 5 at 2,3",
        "5 at 2, 3",
        "(2,3,5)",
        "2, 3, 5",
        "I think 2,3,5",
    ]
    assert {env.parse_action(form) for form in forms} == {"2,3,5"}
    assert env.parse_action("what about 2,3,5") == "3,5,2"  # "at" occurs: RAGEN-2 reads the value first
    assert env.parse_action(" 2 3 5 ") == "2 3 5" and env.parse_action("10,1,1") == "10,1,1"
    assert env.parse_action("   ") is None


def test_sample_action_is_a_valid_placement():
    env, rng = make_env("sudoku"), np.random.default_rng(0)
    for seed in range(20):
        env.reset(seed)
        for _ in range(10):
            info = env.step(env.sample_action(rng))[4]
            assert info["action_is_valid"]


def test_bad_options_are_refused():
    refused = [
        ({"size": 16}, "size must be 4 or 9"),
        ({"difficulty": "extreme"}, "difficulty"),
        ({"render_format": "fancy"}, "render_format"),
        ({"max_steps": 0}, "max_steps"),
    ]
    for options, message in refused:
        with pytest.raises(ValueError, match=message):
            make_env("sudoku", **options)


@pytest.mark.parametrize(("difficulty", "empty"), [("easy", 32), ("medium", 40), ("hard", 48)])
def test_expert_solves_200_seeds_with_one_correct_placement_per_empty_cell(difficulty, empty):
    env = make_env("sudoku", difficulty=difficulty)
    for seed in range(200):
        env.reset(seed)
        total, steps = 0.0, 0
        while not env.success and steps < env.max_steps:
            for action in env.expert_plan(env.max_steps - steps)[:5]:
                total += env.step(action)[1]
                steps += 1
        assert env.success and steps == empty and total == pytest.approx(empty + 10), seed


def test_expert_recovers_after_random_placements_unless_no_completion_is_left():
    env, rng = make_env("sudoku"), np.random.default_rng(0)
    solved = 0
    for seed in range(40):
        env.reset(seed)
        for _ in range(8):
            env.step(env.sample_action(rng))
        while not env.success and env.steps < env.max_steps and (plan := env.expert_plan(env.max_steps)):
            for action in plan:
                env.step(action)
        solved += env.success
        # a cell cannot be emptied: a board whose filled cells admit no solution is a dead end for any player
        assert env.success or _solutions(env.board, 9, limit=1) == [], seed
    assert solved >= 36  # measured: 38 of 40


# ---- a port of RAGEN-2's env (ragen/env/sudoku/env.py and utils.py at 20daedc) for the cross-check ----------------

_RAGEN_PATTERNS = [
    r"place\s+(\d+)\s+at\s+row\s+(\d+)\s+col\s+(\d+)",
    r"place\s+(\d+)\s+at\s+\((\d+),\s*(\d+)\)",
    r"place\s+(\d+)\s+at\s+(\d+),\s*(\d+)",
    r"(\d+)\s+at\s+(\d+),\s*(\d+)",
    r"\((\d+),\s*(\d+),\s*(\d+)\)",
    r"(\d+),\s*(\d+),\s*(\d+)",
]


class _Ragen2Sudoku:
    def __init__(self, puzzle: SudokuPuzzle, render_format: str) -> None:
        n = self.n = puzzle.size
        self.box = int(np.sqrt(n))
        self.initial = np.array(puzzle.puzzle).reshape(n, n)
        self.solution = np.array(puzzle.solution).reshape(n, n)
        self.grid, self.steps, self.feedback, self.format = self.initial.copy(), 0, "", render_format

    def parse(self, action):
        action = action.strip().lower()
        for pattern in _RAGEN_PATTERNS:
            match = re.search(pattern, action)
            if match:
                if "place" in action or "at" in action:
                    num, row, col = map(int, match.groups())
                else:
                    row, col, num = map(int, match.groups())
                row, col = row - 1, col - 1
                if not 0 <= row < self.n:
                    return False, -1, -1, -1, f"Row {row + 1} is out of range (1-{self.n})"
                if not 0 <= col < self.n:
                    return False, -1, -1, -1, f"Column {col + 1} is out of range (1-{self.n})"
                if not 1 <= num <= self.n:
                    return False, -1, -1, -1, f"Number {num} is out of range (1-{self.n})"
                return True, row, col, num, ""
        msg = f"Could not parse action: '{action}'. Expected format: 'place 5 at row 2 col 3' or '2,3,5'"
        return False, -1, -1, -1, msg

    def box_of(self, grid, row, col):
        r0, c0 = row // self.box * self.box, col // self.box * self.box
        return grid[r0 : r0 + self.box, c0 : c0 + self.box]

    def valid_numbers(self, row, col):
        if self.grid[row, col] != 0:
            return set()
        used = set(self.grid[row, :]) | set(self.grid[:, col]) | set(self.box_of(self.grid, row, col).flatten())
        return set(range(1, self.n + 1)) - (used - {0})

    def conflicts(self):
        cells = set()
        for i in range(self.n):
            for num in range(1, self.n + 1):
                in_row, in_col = np.where(self.grid[i, :] == num)[0], np.where(self.grid[:, i] == num)[0]
                cells |= {(i, int(p)) for p in in_row} if len(in_row) > 1 else set()
                cells |= {(int(p), i) for p in in_col} if len(in_col) > 1 else set()
        for r0 in range(0, self.n, self.box):
            for c0 in range(0, self.n, self.box):
                block = self.grid[r0 : r0 + self.box, c0 : c0 + self.box]
                for num in range(1, self.n + 1):
                    if (block == num).sum() > 1:
                        cells |= {(r0 + int(a), c0 + int(b)) for a, b in np.argwhere(block == num)}
        return cells

    def step(self, action):
        self.steps += 1
        ok, row, col, num, error = self.parse(action)
        if not ok:
            self.feedback = f"\u274c Invalid action format: {error}"
            return self.render(), -0.1, False, {"action_is_valid": False, "success": False}
        if self.initial[row, col] != 0:
            self.feedback = f"\u274c Cannot modify initial cell at ({row + 1},{col + 1})"
            return self.render(), -0.1, False, {"action_is_valid": False, "success": False}
        box = self.box_of(self.grid, row, col)
        if num in self.grid[row, :] or num in self.grid[:, col] or num in box:
            where = [f"row {row + 1}"] if num in self.grid[row, :] else []
            where += [f"column {col + 1}"] if num in self.grid[:, col] else []
            where += [f"box ({row // self.box + 1},{col // self.box + 1})"] if num in box else []
            self.feedback = f"\u274c Invalid placement: {num} conflicts with {', '.join(where)}"
            valid = self.valid_numbers(row, col)
            if valid:
                self.feedback += f"\n   Valid numbers for ({row + 1},{col + 1}): {sorted(valid)}"
            return self.render(), -0.1, False, {"action_is_valid": False, "success": False}
        self.grid[row, col] = num
        if num == self.solution[row, col]:
            self.feedback, reward = f"\u2713 Correct! Placed {num} at ({row + 1},{col + 1})", 1.0
        else:
            self.feedback, reward = f"\u26a0 Placed {num} at ({row + 1},{col + 1}) - Valid but not optimal", 0.5
        solved = not (self.grid == 0).any() and not self.conflicts()
        if solved:
            self.feedback += "\n\U0001f389 Congratulations! Puzzle solved!"
            reward += 10.0
        return self.render(), reward, solved or self.steps >= 81, {"action_is_valid": True, "success": solved}

    def grid_text(self, marked):
        conflicts, lines = self.conflicts(), []
        for i, row in enumerate(self.grid):
            if i > 0 and i % self.box == 0:
                lines.append("-" * (self.n * (3 if marked else 2) + self.box - 1))
            text = ""
            for j, val in enumerate(row):
                text += "| " if j > 0 and j % self.box == 0 else ""
                if not marked:
                    text += (str(val) if val != 0 else ".") + " "
                elif val == 0:
                    text += " . "
                elif self.initial[i, j] != 0:
                    text += f"[{val}]"
                else:
                    text += f"*{val}*" if (i, j) in conflicts else f" {val} "
            lines.append(text.rstrip())
        return "\n".join(lines)

    def render(self):
        if self.format == "simple":
            return self.grid_text(False)
        out = [
            "=" * 50,
            "SUDOKU PUZZLE",
            "=" * 50,
            self.grid_text(True),
            "",
            "Legend: [N]=initial cell, N=user-placed, *N*=conflict, .=empty",
        ]
        if self.feedback:
            out += ["", self.feedback]
        if self.format == "detailed":
            return "\n".join(out)
        if self.conflicts():
            out += ["", "\u26a0 CONFLICTS DETECTED:"]
            out += [f"  - Cell ({r + 1},{c + 1}): {self.grid[r, c]}" for r, c in sorted(self.conflicts())]
        empty = list(zip(*np.where(self.grid == 0), strict=True))
        if empty and len(empty) <= 10:
            out += ["", "\U0001f4a1 VALID NUMBERS FOR EMPTY CELLS:"]
            for row, col in empty[:10]:
                valid = self.valid_numbers(row, col)
                if valid and self.initial[row, col] == 0:
                    out.append(f"  - ({row + 1},{col + 1}): {sorted(valid)}")
        filled, initial = np.count_nonzero(self.grid), np.count_nonzero(self.initial)
        progress = f"{filled}/{self.n * self.n} cells filled ({initial} initial, {filled - initial} placed)"
        out += ["", f"Progress: {progress}"]
        return "\n".join([*out, f"Steps: {self.steps}/81"])


def _random_item(env, rng) -> str:
    """A placement in one of RAGEN-2's forms (or ours, or noise), often out of range or clashing."""
    kind = int(rng.integers(0, 4))
    if kind == 0:
        return env.sample_action(rng)
    if kind == 1:
        return (env.expert_plan(81) or ["1,1,1"])[0]
    r, c, v = (int(x) for x in rng.integers(0, env.size + 2, size=3))
    forms = [
        f"{r},{c},{v}",
        f"place {v} at row {r} col {c}",
        f"place {v} at ({r},{c})",
        f"{v} at {r}, {c}",
        f"({r}, {c}, {v})",
        f"{r} {c} {v}",
        "what about 2,3,1",
        "up",
    ]
    return forms[int(rng.integers(0, len(forms)))]


@pytest.mark.parametrize(
    ("size", "render_format"), [(4, "with_feedback"), (9, "with_feedback"), (9, "detailed"), (4, "simple")]
)
def test_steps_and_renders_match_a_port_of_ragens_env(size, render_format):
    env, rng = make_env("sudoku", size=size, render_format=render_format), np.random.default_rng(size)
    for seed in range(25 if size == 4 else 10):
        ours_obs, _ = env.reset(seed)
        port = _Ragen2Sudoku(env.instance, render_format)
        assert ours_obs == port.render()
        for _ in range(60):
            item = _random_item(env, rng)
            obs, reward, terminated, truncated, info = env.step(env.parse_action(item))
            port_obs, port_reward, port_done, port_info = port.step(item)
            assert (obs, reward, terminated or truncated) == (port_obs, pytest.approx(port_reward), port_done), item
            assert (info["action_is_valid"], info["success"]) == (port_info["action_is_valid"], port_info["success"])
            if terminated or truncated:
                break


def test_the_old_9x9_name_says_where_it_went():
    with pytest.raises(ValueError, match="sudoku_pr147_9x9"):
        make_env("sudoku_9x9")
