from racky.cli import main

main()
