"""F1 and exact match with the SQuAD normalisation, best over aliases."""

from __future__ import annotations

import pytest

from agentgym_lightning.envs.rag.scoring import best_score, exact_match, f1, normalize_answer, score_answer


@pytest.mark.parametrize(
    "text, normal",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  a  Tale of   Two Cities. ", "tale of two cities"),
        ("An apple, the pear", "apple pear"),
        ("U.S.A.", "usa"),
        ("Theory of the Leisure Class", "theory of leisure class"),  # "the" inside "Theory" stays
        ("", ""),
    ],
)
def test_squad_normalisation(text, normal):
    assert normalize_answer(text) == normal


def test_exact_match_ignores_case_punctuation_articles_and_spacing():
    assert exact_match("the  Saltreach Academy.", "Saltreach academy") == 1.0
    assert exact_match("Saltreach", "Saltreach Academy") == 0.0


def test_f1_standard_cases():
    assert f1("Saltreach Academy", "Saltreach Academy") == 1.0
    assert f1("Saltreach", "Saltreach Academy") == pytest.approx(2 * 1.0 * 0.5 / 1.5)  # p=1, r=1/2
    assert f1("the Saltreach city academy", "Saltreach Academy") == pytest.approx(2 * (2 / 3) * 1.0 / (2 / 3 + 1))
    assert f1("Marrowgate", "Saltreach") == 0.0
    # Tokens count as a multiset: a repeated word matches once.
    assert f1("new new york", "new york") == pytest.approx(2 * (2 / 3) * 1.0 / (2 / 3 + 1))
    # Empty against non-empty is 0; two empties match (SQuAD's rule).
    assert f1("", "Saltreach") == 0.0 and f1("the", "a") == 1.0


def test_best_over_every_alias():
    answers = ["3,104 metres", "3104 metres", "3,104 m"]
    assert best_score("3104 metres", answers, "em") == 1.0  # "3,104" normalises to "3104"
    assert best_score("3,104 m", answers, "em") == 1.0
    assert best_score("about 3104 metres", answers, "f1") == pytest.approx(0.8)  # p=2/3, r=1 vs alias 2
    assert score_answer("Stanley Hall", ["G. Stanley Hall", "Stanley Hall"]) == {"f1": 1.0, "em": 1.0}
    assert score_answer("G Stanley Hall", ["G. Stanley Hall"]) == {"f1": 1.0, "em": 1.0}


def test_no_answer_scores_zero_and_bad_input_is_an_error():
    assert score_answer(None, ["x"]) == {"f1": 0.0, "em": 0.0}
    with pytest.raises(ValueError, match="no accepted answer"):
        best_score("x", [])
    with pytest.raises(ValueError, match="unknown answer metric"):
        best_score("x", ["x"], "bleu")
