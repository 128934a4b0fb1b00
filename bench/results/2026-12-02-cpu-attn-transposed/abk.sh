#!/bin/bash
# usage: abk.sh N binA binB [args...]: alternate, print min per binary for each shape
n=$1; a=$2; b=$3; shift 3
for i in $(seq $n); do
  for x in A B; do bin=$a; [ $x = B ] && bin=$b
    $bin "$@" | grep -E "B-A3B|hd64" | sed "s/^/$x /"
  done
done | awk '{k=$1" "$2; t=$(NF-5); if(!(k in m)||t<m[k])m[k]=t} END{for(k in m)print k, m[k]}' | sort -k2,2 -k1,1
