"""Result tables and figures that mirror the paper's, with its reference rows beside ours."""
