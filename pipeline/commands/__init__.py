"""One module per ``specsweep`` subcommand. Each defines HELP, ``add_arguments(parser)`` and ``main(args)``,
and imports heavy libraries inside ``main`` so that ``specsweep --help`` stays fast."""
