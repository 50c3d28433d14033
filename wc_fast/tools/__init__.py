"""Command-line programs beside the main ones: training and checking the shipped reward models,
and comparing evaluation results. They use the library; nothing in the library imports them."""
