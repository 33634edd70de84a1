from parley.cli import main

main()
