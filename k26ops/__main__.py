from k26ops.cli import main

main()
