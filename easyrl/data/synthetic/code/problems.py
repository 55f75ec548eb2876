"""The built-in programming problems: easy tasks, each with a reference solution and 3-6 tests.

Two styles, as in the public code-RL data sets: `stdin` problems read standard input and print (APPS, TACO,
CodeContests), `call` problems define a function that is called with arguments (LeetCode-style sets). tests/
runs every reference solution through reward_function/code.py and expects a pass rate of 1.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    name: str
    statement: str
    tests: tuple  # ((input, output), ...): stdin text and expected stdout, or an argument list and a return value
    solution: str
    fn_name: str | None = None  # set for function-call problems

    @property
    def style(self) -> str:
        return "stdin" if self.fn_name is None else "call"


def _stdin(name: str, statement: str, tests: list[tuple[str, str]], solution: str) -> Problem:
    text = f"{statement}\nRead the input from standard input and print the answer to standard output."
    return Problem(name, text, tuple(tests), solution)


def _call(name: str, signature: str, statement: str, tests: list[tuple[list, object]], solution: str) -> Problem:
    text = f"Write a Python function `{signature}` that {statement}"
    return Problem(name, text, tuple(tests), solution, fn_name=signature.split("(")[0])


PROBLEMS: tuple[Problem, ...] = (
    _stdin(
        "sum_two",
        "Given two integers a and b on one line, separated by a space, print their sum.",
        [("1 2\n", "3\n"), ("-5 5\n", "0\n"), ("100 250\n", "350\n"), ("7 -10\n", "-3\n")],
        "a, b = map(int, input().split())\nprint(a + b)\n",
    ),
    _stdin(
        "max_of_list",
        "The first line holds n, the second line n integers. Print the largest of them.",
        [("3\n1 5 2\n", "5\n"), ("1\n-7\n", "-7\n"), ("4\n-1 -2 -3 -4\n", "-1\n"), ("5\n9 9 1 0 9\n", "9\n")],
        "input()\nprint(max(map(int, input().split())))\n",
    ),
    _stdin(
        "reverse_string",
        "Given a word on one line, print it reversed.",
        [("hello\n", "olleh\n"), ("a\n", "a\n"), ("racecar\n", "racecar\n"), ("abc123\n", "321cba\n")],
        "print(input().strip()[::-1])\n",
    ),
    _stdin(
        "count_vowels",
        "Given a line of lowercase letters and spaces, print how many vowels (a, e, i, o, u) it contains.",
        [("hello world\n", "3\n"), ("xyz\n", "0\n"), ("aeiou\n", "5\n"), ("programming is fun\n", "5\n")],
        "print(sum(c in 'aeiou' for c in input()))\n",
    ),
    _stdin(
        "even_or_odd",
        "Given an integer n, print EVEN if it is even and ODD otherwise.",
        [("4\n", "EVEN\n"), ("7\n", "ODD\n"), ("0\n", "EVEN\n"), ("-3\n", "ODD\n")],
        "print('EVEN' if int(input()) % 2 == 0 else 'ODD')\n",
    ),
    _stdin(
        "factorial",
        "Given an integer n (0 <= n <= 20), print n! (the product 1 * 2 * ... * n; 0! is 1).",
        [("0\n", "1\n"), ("5\n", "120\n"), ("10\n", "3628800\n"), ("1\n", "1\n"), ("20\n", "2432902008176640000\n")],
        "import math\nprint(math.factorial(int(input())))\n",
    ),
    _stdin(
        "fizzbuzz",
        "Given n, print the numbers 1 to n, one per line, but print Fizz for multiples of 3, Buzz for multiples of "
        "5 and FizzBuzz for multiples of both.",
        [
            ("3\n", "1\n2\nFizz\n"),
            ("5\n", "1\n2\nFizz\n4\nBuzz\n"),
            ("1\n", "1\n"),
            ("15\n", "1\n2\nFizz\n4\nBuzz\nFizz\n7\n8\nFizz\nBuzz\n11\nFizz\n13\n14\nFizzBuzz\n"),
        ],
        "for i in range(1, int(input()) + 1):\n"
        "    print('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else i)\n",
    ),  # fmt: skip
    _stdin(
        "sum_of_digits",
        "Given a non-negative integer n, print the sum of its decimal digits.",
        [("0\n", "0\n"), ("123\n", "6\n"), ("9999\n", "36\n"), ("1000001\n", "2\n")],
        "print(sum(int(d) for d in input().strip()))\n",
    ),
    _stdin(
        "sort_numbers",
        "The first line holds n, the second line n integers. Print them in increasing order on one line, separated "
        "by spaces.",
        [("3\n3 1 2\n", "1 2 3\n"), ("1\n5\n", "5\n"), ("5\n5 -1 3 3 0\n", "-1 0 3 3 5\n")],
        "input()\nprint(*sorted(map(int, input().split())))\n",
    ),
    _stdin(
        "word_count",
        "Given a line of text, print the number of words in it (words are separated by one or more spaces).",
        [("hello world\n", "2\n"), ("one\n", "1\n"), ("  a  b   c \n", "3\n"), ("the quick brown fox\n", "4\n")],
        "print(len(input().split()))\n",
    ),
    _stdin(
        "is_palindrome",
        "Given a word, print YES if it reads the same forwards and backwards, else NO.",
        [("level\n", "YES\n"), ("hello\n", "NO\n"), ("a\n", "YES\n"), ("abca\n", "NO\n"), ("abba\n", "YES\n")],
        "s = input().strip()\nprint('YES' if s == s[::-1] else 'NO')\n",
    ),
    _stdin(
        "multiplication_row",
        "Given an integer n, print n*1, n*2, ..., n*5 on one line, separated by spaces.",
        [("1\n", "1 2 3 4 5\n"), ("3\n", "3 6 9 12 15\n"), ("0\n", "0 0 0 0 0\n"), ("-2\n", "-2 -4 -6 -8 -10\n")],
        "n = int(input())\nprint(*(n * i for i in range(1, 6)))\n",
    ),
    _stdin(
        "min_max",
        "Given integers on one line, separated by spaces, print the smallest and the largest, separated by a space.",
        [("3 1 2\n", "1 3\n"), ("5\n", "5 5\n"), ("-1 -9 4 4\n", "-9 4\n")],
        "xs = list(map(int, input().split()))\nprint(min(xs), max(xs))\n",
    ),
    _stdin(
        "count_char",
        "The first line holds a word, the second a single character. Print how often the character occurs in the "
        "word.",
        [("banana\na\n", "3\n"), ("hello\nz\n", "0\n"), ("mississippi\ns\n", "4\n")],
        "word = input().strip()\nprint(word.count(input().strip()))\n",
    ),
    _stdin(
        "average",
        "Given integers on one line, separated by spaces, print their average rounded down to an integer.",
        [("1 2 3\n", "2\n"), ("10\n", "10\n"), ("1 2\n", "1\n"), ("4 4 4 5\n", "4\n")],
        "xs = list(map(int, input().split()))\nprint(sum(xs) // len(xs))\n",
    ),
    _stdin(
        "gcd",
        "Given two positive integers a and b on one line, print their greatest common divisor.",
        [("12 18\n", "6\n"), ("7 13\n", "1\n"), ("100 75\n", "25\n"), ("5 5\n", "5\n")],
        "import math\na, b = map(int, input().split())\nprint(math.gcd(a, b))\n",
    ),
    _call(
        "add",
        "add(a, b)",
        "returns the sum of the integers a and b.",
        [([1, 2], 3), ([-4, 4], 0), ([100, 23], 123)],
        "def add(a, b):\n    return a + b\n",
    ),
    _call(
        "square_list",
        "square_list(xs)",
        "returns a list with the square of every number of the list xs, in the same order.",
        [([[1, 2, 3]], [1, 4, 9]), ([[]], []), ([[-2, 0, 5]], [4, 0, 25])],
        "def square_list(xs):\n    return [x * x for x in xs]\n",
    ),
    _call(
        "is_prime",
        "is_prime(n)",
        "returns True if the integer n is a prime number, else False.",
        [([2], True), ([1], False), ([17], True), ([21], False), ([97], True)],
        "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n",
    ),
    _call(
        "count_positive",
        "count_positive(xs)",
        "returns how many numbers in the list xs are greater than zero.",
        [([[1, -2, 3]], 2), ([[]], 0), ([[0, 0, 0]], 0), ([[5, 6, 7, -1]], 3)],
        "def count_positive(xs):\n    return sum(1 for x in xs if x > 0)\n",
    ),
    _call(
        "fibonacci",
        "fibonacci(n)",
        "returns the n-th Fibonacci number, where fibonacci(0) = 0 and fibonacci(1) = 1.",
        [([0], 0), ([1], 1), ([10], 55), ([20], 6765)],
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    ),
    _call(
        "capitalize_words",
        "capitalize_words(s)",
        "returns the string s with the first letter of every space-separated word in upper case and the rest "
        "unchanged.",
        [(["hello world"], "Hello World"), (["a"], "A"), (["python is fun"], "Python Is Fun")],
        "def capitalize_words(s):\n    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))\n",
    ),
    _call(
        "remove_duplicates",
        "remove_duplicates(xs)",
        "returns the list xs without repeated elements, keeping the first occurrence of each in order.",
        [([[1, 2, 1, 3, 2]], [1, 2, 3]), ([[]], []), ([[5, 5, 5]], [5]), ([[3, 1, 2]], [3, 1, 2])],
        "def remove_duplicates(xs):\n    return list(dict.fromkeys(xs))\n",
    ),
    _call(
        "second_largest",
        "second_largest(xs)",
        "returns the second largest distinct value of the list xs (it holds at least two distinct values).",
        [([[1, 2, 3]], 2), ([[5, 5, 4]], 4), ([[-1, -2]], -2), ([[10, 9, 10, 8]], 9)],
        "def second_largest(xs):\n    return sorted(set(xs))[-2]\n",
    ),
    _call(
        "celsius_to_fahrenheit",
        "celsius_to_fahrenheit(c)",
        "returns the temperature c (degrees Celsius) in degrees Fahrenheit: c * 9 / 5 + 32.",
        [([0], 32.0), ([100], 212.0), ([-40], -40.0), ([37], 98.6)],
        "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32\n",
    ),
    _call(
        "flatten",
        "flatten(lists)",
        "returns one list with the elements of the lists in `lists`, in order.",
        [([[[1, 2], [3]]], [1, 2, 3]), ([[[], [1]]], [1]), ([[]], []), ([[[4], [5, 6], []]], [4, 5, 6])],
        "def flatten(lists):\n    return [x for xs in lists for x in xs]\n",
    ),
    _call(
        "char_frequency",
        "char_frequency(s)",
        "returns a dict mapping each character of the string s to the number of times it occurs.",
        [(["aab"], {"a": 2, "b": 1}), ([""], {}), (["abc"], {"a": 1, "b": 1, "c": 1})],
        "def char_frequency(s):\n    counts = {}\n    for c in s:\n        counts[c] = counts.get(c, 0) + 1\n"
        "    return counts\n",
    ),
    _call(
        "two_sum",
        "two_sum(nums, target)",
        "returns the indices [i, j] (i < j) of the only two numbers of the list nums that add up to target.",
        [([[2, 7, 11, 15], 9], [0, 1]), ([[3, 2, 4], 6], [1, 2]), ([[1, 5, 3, 8], 11], [2, 3])],
        "def two_sum(nums, target):\n    seen = {}\n    for j, x in enumerate(nums):\n"
        "        if target - x in seen:\n            return [seen[target - x], j]\n        seen[x] = j\n",
    ),
    _call(
        "running_sum",
        "running_sum(xs)",
        "returns the list whose i-th element is the sum of xs[0] .. xs[i].",
        [([[1, 2, 3, 4]], [1, 3, 6, 10]), ([[]], []), ([[5, -5, 5]], [5, 0, 5])],
        "def running_sum(xs):\n    out, total = [], 0\n    for x in xs:\n        total += x\n        out.append(total)\n"
        "    return out\n",
    ),
    _call(
        "is_anagram",
        "is_anagram(a, b)",
        "returns True if the strings a and b contain the same letters the same number of times, else False.",
        [(["listen", "silent"], True), (["abc", "abd"], False), (["", ""], True), (["aab", "abb"], False)],
        "def is_anagram(a, b):\n    return sorted(a) == sorted(b)\n",
    ),
    _call(
        "max_subarray_sum",
        "max_subarray_sum(xs)",
        "returns the largest sum of a non-empty run of consecutive elements of the non-empty list xs.",
        [([[1, -2, 3, 4]], 7), ([[-3, -1, -2]], -1), ([[5]], 5), ([[2, -1, 2, -5, 4]], 4)],
        "def max_subarray_sum(xs):\n    best = current = xs[0]\n    for x in xs[1:]:\n"
        "        current = max(x, current + x)\n        best = max(best, current)\n    return best\n",
    ),
    _call(
        "binary_string",
        "binary_string(n)",
        "returns the binary representation of the non-negative integer n as a string without a prefix.",
        [([0], "0"), ([5], "101"), ([8], "1000"), ([255], "11111111")],
        "def binary_string(n):\n    return bin(n)[2:]\n",
    ),
)
