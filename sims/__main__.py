from sims.cli import main

main()
